"""`flashnpc eval [--model DIR] --json OUT [--fast]`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=None, help="exported model directory (default: shipped)")
    parser.add_argument("--line-book", type=Path, default=None, help="line book (default: shipped)")
    parser.add_argument("--json", type=Path, required=True, help="where to write every figure")
    parser.add_argument("--fast", action="store_true", help="a small slice (seconds, for smoke checks)")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from runtime.evaluate import EvalConfig, evaluate
    from runtime.linebook import load_line_book

    cfg = EvalConfig.fast() if args.fast else EvalConfig()
    cfg.seed = args.seed
    book = load_line_book(args.line_book)
    report = evaluate(args.model, line_book=book, cfg=cfg, progress=lambda m: print(f"· {m}", file=sys.stderr))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    for name, value in report["figures"].items():
        mark = {True: "PASS", False: "FAIL"}.get(report["checks"].get(name), "    ")
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        if report["checks"].get(name, False) is None:
            mark = "n/a "
        print(f"{mark}  {name:34s} {shown}")
    print(f"{'PASSED' if report['passed'] else 'FAILED'} in {report['seconds']:.0f} s -> {args.json}")
    return 0 if report["passed"] else 1
