"""`flashnpc eval [--model DIR] --json OUT [--fast]`, and the blind-rating kit:

    flashnpc eval blind --model DIR --model-lines N --book-lines M --seed S --out FILE.csv
    flashnpc eval unblind FILE.csv [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=None, help="exported model directory (default: shipped)")
    parser.add_argument("--line-book", type=Path, default=None, help="line book (default: shipped)")
    parser.add_argument("--json", type=Path, default=None,
                        help="where to write every figure (required without a subcommand)")
    parser.add_argument("--fast", action="store_true", help="a small slice (seconds, for smoke checks)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    sub = parser.add_subparsers(dest="eval_command", metavar="{blind,unblind}")
    # the subcommands share --model, --line-book, --seed, --json with plain `flashnpc eval`;
    # SUPPRESS keeps a value given before the subcommand's name
    blind = sub.add_parser("blind", help="write model and book lines, shuffled, for blind rating",
                           description="Write N model lines and M book lines over the same prompt mix, "
                                       "shuffled, to FILE.csv (id, prompt, line, rating) and the hidden "
                                       "key to FILE.key.json.")
    blind.add_argument("--model", type=Path, default=argparse.SUPPRESS, help="exported model directory")
    blind.add_argument("--line-book", type=Path, default=argparse.SUPPRESS, help="line book")
    blind.add_argument("--seed", type=int, default=argparse.SUPPRESS)
    blind.add_argument("--model-lines", type=int, default=100, help="model lines to rate (default 100)")
    blind.add_argument("--book-lines", type=int, default=50, help="book lines to rate (default 50)")
    blind.add_argument("--out", type=Path, required=True, help="the CSV to write (its key beside it)")
    unblind = sub.add_parser("unblind", help="check a rated file against its key and summarise",
                             description="Read a rated FILE.csv and FILE.key.json; print shippable / "
                                         "clumsy / garbled shares per source, prompt shape and side.")
    unblind.add_argument("file", type=Path, help="the rated CSV")
    unblind.add_argument("--key", type=Path, default=None, help="the key (default: FILE.key.json)")
    unblind.add_argument("--json", type=Path, default=argparse.SUPPRESS, help="also write the summary here")


def run(args: argparse.Namespace) -> int:
    command = getattr(args, "eval_command", None)
    if command == "blind":
        return _blind(args)
    if command == "unblind":
        return _unblind(args)
    if args.json is None:
        print("flashnpc eval: --json OUT is required (or: flashnpc eval blind | unblind)", file=sys.stderr)
        return 2
    from runtime.evaluate import EvalConfig, evaluate
    from runtime.linebook import load_line_book
    from runtime.writer_eval import format_writer_table

    cfg = EvalConfig.fast() if args.fast else EvalConfig()
    cfg.seed = args.seed
    book = load_line_book(args.line_book)
    report = evaluate(args.model, line_book=book, cfg=cfg, progress=lambda m: print(f"· {m}", file=sys.stderr),
                      progress_bar=not args.no_progress)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    for name, value in report["figures"].items():
        mark = {True: "PASS", False: "FAIL"}.get(report["checks"].get(name), "    ")
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        if report["checks"].get(name, False) is None:
            mark = "n/a "
        print(f"{mark}  {name:34s} {shown}")
    print()
    print(format_writer_table(report["writer"]))
    failed = report["writer"]["failed"]
    print(f"writer figures: {len(failed)} of {len(report['writer']['checks'])} checks miss their target")
    print(f"{'PASSED' if report['passed'] else 'FAILED'} in {report['seconds']:.0f} s -> {args.json}")
    return 0 if report["passed"] else 1


def _blind(args: argparse.Namespace) -> int:
    from runtime.blind import key_path, write_blind
    from runtime.evaluate import EvalConfig, Sampler
    from runtime.linebook import load_line_book
    from runtime.onnx_model import FlashOnnx

    book = load_line_book(args.line_book)
    cfg = EvalConfig(seed=args.seed)
    sampler = Sampler(FlashOnnx.load(args.model, file="model.int4.onnx"), cfg, book)
    try:
        key = write_blind(args.out, book=book, sampler=sampler, model_lines=args.model_lines,
                          book_lines=args.book_lines, seed=args.seed,
                          model_name=str(args.model) if args.model else "shipped default")
    except ValueError as exc:
        print(f"flashnpc eval blind: {exc}", file=sys.stderr)
        return 2
    print(f"{len(key['items'])} lines to rate -> {args.out} (key: {key_path(args.out)}; keep it from the raters)")
    print(f"rating: {key['rating_scale']}")
    return 0


def _unblind(args: argparse.Namespace) -> int:
    from runtime.blind import RatingsError, format_summary, read_ratings, summarise

    try:
        rated = read_ratings(args.file, args.key)
    except RatingsError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        print(f"flashnpc eval unblind: {len(exc.problems)} problem(s); nothing summarised", file=sys.stderr)
        return 1
    summary = summarise(rated)
    print(format_summary(summary))
    if getattr(args, "json", None) is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2))
    return 0
