"""The runtime's commands: ``flashnpc train``, ``flashnpc eval`` and ``flashnpc export [onnx]``.

``flashnpc train``: train the Flash line model on a line book.

    flashnpc train --out runs/flash                 # default model, ~25 min on a 2-core CPU
    flashnpc train --out runs/flash --resume        # continue from runs/flash/model.pt
    flashnpc train --out /tmp/t --tiny              # tiny model, a couple of minutes, for smoke tests
    flashnpc train --out runs/x --config '{"n_expert": 8, "steps": 2000}'

``--config`` takes a JSON object (inline or a file path) of FlashConfig and/or
TrainConfig fields. The tokenizer is trained on the training split's lines unless
DIR already holds a tokenizer.json.

``flashnpc eval [--model DIR] --json OUT [--fast]``, and the blind-rating kit:

    flashnpc eval blind --model DIR --model-lines N --book-lines M --seed S --out FILE.csv [--versus DIR2]
    flashnpc eval unblind FILE.csv [--json OUT]

``flashnpc export onnx --model CKPT --out DIR [--accuracy-level 0|4]``: checkpoint -> model
directory. Writes ``model.onnx`` (fp32 reference), ``model.int4.onnx`` (shipped: INT4, truly
sparse experts), copies tokenizer.json / config.json / catalog.json (and fallbacks.json, or
builds it from the default line book), and writes ``export.json``. ``--out`` is required: to
refresh the shipped model, name ``runtime/assets/flash`` yourself. The ``export`` command and
its other forms are :mod:`mobile_export.cli`'s; it calls :func:`add_export_onnx_arguments` and
:func:`run_export_onnx` for this one.

``--json`` (train, export onnx, finetune) prints the figures as one JSON object on stdout instead of the
text; progress bars go to stderr (``--no-progress``, or ``train --quiet``, turns them off).

Everything heavy (torch, the model factory) is imported inside the commands, so the
``flashnpc`` dispatcher can build its parser without them.
"""

from __future__ import annotations

import os

# Spinning OpenMP workers lose badly on a shared, oversubscribed CPU (measured 2-10x
# slower steps); passive waiting costs little when the machine is idle. Must be set
# before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.console import Progress, print_json, ticking

if TYPE_CHECKING:  # torch is an extra: `flashnpc` must start without it
    from runtime.factory.evaluate import EvalConfig
    from runtime.factory.model import FlashConfig
    from runtime.factory.train import TrainConfig

__all__ = ["DEFAULT_CHECKPOINT", "EXPECTED_ERRORS", "add_eval_arguments", "add_export_onnx_arguments",
           "add_output_arguments", "add_train_arguments", "run_eval", "run_export_onnx", "run_train"]

# `flashnpc export onnx`'s default checkpoint: what `flashnpc train --out runs/flash` writes
DEFAULT_CHECKPOINT = Path("runs/flash")

# errors the `flashnpc` dispatcher reports as one line (module:class, resolved once loaded)
EXPECTED_ERRORS = ("runtime.client.errors:ModelLoadError", "runtime.factory.export:ExportError",
                   "runtime.factory.linebook:LineBookError", "runtime.factory.blind:RatingsError",
                   "runtime.factory.finetune:FinetuneError")


def add_output_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--json`` and ``--no-progress``, for a command that reports figures and takes a while."""
    parser.add_argument("--json", action="store_true",
                        help="print the result as one JSON object on stdout instead of text")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")

# --------------------------------------------------------------------------- flashnpc train

# Small enough to train in a couple of minutes on the CPU; used by --tiny and tests.
TINY_MODEL = dict(vocab_size=512, block_size=96, n_layer=2, n_head=2, n_embd=64, n_expert=8,
                  expert_hidden=64, top_k=1)
TINY_TRAIN = dict(steps=200, batch_size=16, lr=3e-3, min_lr=3e-4, warmup_steps=20,
                  eval_interval=50, eval_examples=128, checkpoint_interval=50)


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--line-book", metavar="PATH", default=None,
                        help="line book directory or file (default: the shipped book)")
    parser.add_argument("--config", metavar="JSON", default=None,
                        help="JSON object (inline or a file path) of model/training settings")
    parser.add_argument("--out", metavar="DIR", required=True, help="checkpoint directory")
    parser.add_argument("--steps", type=int, default=None, metavar="N", help="optimiser steps (default 3000)")
    parser.add_argument("--batch-size", type=int, default=None, metavar="N", help="examples per step (default 32)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="default: cuda when available, else cpu")
    parser.add_argument("--resume", action="store_true", help="continue from DIR/model.pt if present")
    parser.add_argument("--init-from", metavar="MODEL", default=None,
                        help="warm start: begin from this model's weights and tokenizer (an exported "
                             "model directory or a checkpoint directory) with a fresh schedule")
    parser.add_argument("--seed", type=int, default=None, metavar="N", help="seed for init and data order (default 0)")
    parser.add_argument("--tiny", action="store_true", help="tiny model and schedule, for smoke tests")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="CPU threads for torch (default: all cores, at most 8)")
    parser.add_argument("--budget-s", type=float, default=None, metavar="S",
                        help="cut the schedule (at most --steps) to what fits in about S seconds of "
                             "training, timed over its first steps (for a machine lent for a fixed time)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true",
                        help="print the final figures as one JSON object on stdout instead of text")


def load_overrides(value: str | None) -> dict[str, Any]:
    """Parse --config: an inline JSON object or the path of a JSON file holding one."""
    if value is None:
        return {}
    text = value
    if not value.lstrip().startswith("{"):
        path = Path(value)
        if not path.is_file():
            raise ValueError(f"--config: {value!r} is neither a JSON object nor an existing file")
        text = path.read_text()
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--config: invalid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise ValueError(f"--config: expected a JSON object, got {type(obj).__name__}")
    return obj


def build_configs(args: argparse.Namespace) -> tuple[FlashConfig, TrainConfig]:
    from runtime.factory.model import FlashConfig
    from runtime.factory.train import TrainConfig, split_overrides

    model_kw: dict[str, Any] = dict(TINY_MODEL) if args.tiny else {}
    train_kw: dict[str, Any] = dict(TINY_TRAIN) if args.tiny else {}
    user_model, user_train = split_overrides(load_overrides(args.config))
    model_kw.update(user_model)
    train_kw.update(user_train)
    for key, value in (("steps", args.steps), ("batch_size", args.batch_size), ("seed", args.seed)):
        if value is not None:
            train_kw[key] = value
    return FlashConfig(**model_kw), TrainConfig(**train_kw)


def run_train(args: argparse.Namespace) -> int:
    try:  # what is wrong with the flags is said at once, before anything slow
        load_overrides(args.config)
        if args.line_book is not None and not Path(args.line_book).exists():
            raise ValueError(f"--line-book {args.line_book}: no such file or directory")
    except ValueError as exc:
        print(f"flashnpc train: error: {exc}", file=sys.stderr)
        return 2
    # the bar starts before torch loads and the line book is read and split (seconds on 2 cores)
    with ticking("train: loading torch and the line book", enabled=not args.quiet):
        inputs = _train_inputs(args)
    if isinstance(inputs, str):  # after the bar has closed its line
        print(f"flashnpc train: error: {inputs}", file=sys.stderr)
        return 2
    return _run_train(args, *inputs)


def _train_inputs(args: argparse.Namespace) -> tuple[Any, Any] | str:
    """(the line book, its split), or what stops the training."""
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError:
        return "training needs torch: pip install torch==2.13.0 && pip install -e '.[train]'"
    from runtime.factory.linebook import LineBookError, load_line_book

    try:
        book = load_line_book(args.line_book)
    except (LineBookError, FileNotFoundError) as exc:
        return str(exc)
    return book, book.split()


def _run_train(args: argparse.Namespace, book: Any, split: Any) -> int:
    import torch

    from runtime.factory.train import train

    try:
        model_cfg, train_cfg = build_configs(args)
    except (ValueError, TypeError) as exc:
        print(f"flashnpc train: error: {exc}", file=sys.stderr)
        return 2
    if args.budget_s is not None and not (math.isfinite(args.budget_s) and args.budget_s > 0):
        print(f"flashnpc train: error: --budget-s must be a number of seconds > 0, got {args.budget_s}",
              file=sys.stderr)
        return 2
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("flashnpc train: error: --device cuda but no CUDA GPU is available", file=sys.stderr)
        return 2
    if device == "cpu":
        torch.set_num_threads(args.threads or min(os.cpu_count() or 1, 8))

    from runtime.tokenizer import Tokenizer, train_tokenizer

    out = Path(args.out)
    # with --json, stdout carries only the JSON object
    note = (lambda msg: print(msg, file=sys.stderr)) if args.json else print
    tok_path = out / "tokenizer.json"
    init_model = None
    if args.init_from is not None and not (args.resume and (out / "model.pt").exists()):
        from runtime.factory.train import initial_model
        from runtime.serving.batched_engine import EngineLoadError

        try:
            init_model, tokenizer = initial_model(args.init_from)
        except (EngineLoadError, FileNotFoundError, ValueError) as exc:
            print(f"flashnpc train: error: --init-from {args.init_from}: {exc}", file=sys.stderr)
            return 2
        from runtime.tokenizer import control_tokens

        known = set(tokenizer.controls)
        missing = [t for t in control_tokens(book.catalog()) if t not in known]
        if missing:
            print(f"flashnpc train: error: --init-from {args.init_from}: its tokenizer has no "
                  f"{', '.join(missing[:5])} (the line book asks for tags the model was not trained "
                  f"with; fine-tune it instead: flashnpc finetune)", file=sys.stderr)
            return 2
        note(f"warm start from {args.init_from} (vocab {tokenizer.vocab_size}, "
             f"{init_model.num_params()['total']:,} parameters)")
    elif tok_path.exists():
        tokenizer = Tokenizer.load(tok_path)
        note(f"tokenizer: loaded {tok_path} (vocab {tokenizer.vocab_size})")
    else:
        with ticking("train: tokenizer", enabled=not args.quiet):
            tokenizer = train_tokenizer([ex.text for ex in split.train], book.catalog(),
                                        vocab_size=model_cfg.vocab_size)
        note(f"tokenizer: trained on {len(split.train)} training lines (vocab {tokenizer.vocab_size})")

    resume = args.resume and (out / "model.pt").exists()
    if args.resume and not resume:
        note(f"no checkpoint in {out}; starting fresh")
    # on resume the saved schedule is kept unless settings were given on the command line
    train_config = None if resume and not _train_settings_given(args) else train_cfg
    try:
        log = train(out, train_examples=split.train, val_examples=split.val, tokenizer=tokenizer,
                    catalog=book.catalog(), model_config=model_cfg, train_config=train_config,
                    device=device, resume=resume, init_from=init_model, progress=not args.quiet,
                    budget_s=args.budget_s)
    except KeyboardInterrupt:
        print(f"\ninterrupted; checkpoint saved in {out}, continue with --resume", file=sys.stderr)
        return 130
    counts = log["num_params"]
    final = log["final"]
    if args.json:
        print_json({"out": str(out), "device": device, **{k: log.get(k) for k in (
            "num_params", "final", "val", "model_config", "train_config", "train_examples",
            "dropped_too_long", "threads", "resumed_at", "budget")}})
        return 0
    print(
        f"done: step {final['step']}, params {counts['total']:,} total / "
        f"{counts['active_per_token']:,} active per token; val CE fp32 {final['val_ce_fp32']:.3f}, "
        f"int4 {final['val_ce_int4']:.3f}; {final['tokens_per_s_this_run']:.0f} tokens/s; wrote {out}"
    )
    return 0


def _train_settings_given(args: argparse.Namespace) -> bool:
    return any(v is not None for v in (args.steps, args.batch_size, args.seed, args.config)) or args.tiny


# --------------------------------------------------------------------------- flashnpc eval

def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=None, help="exported model directory (default: shipped)")
    parser.add_argument("--line-book", type=Path, default=None, help="line book (default: shipped)")
    parser.add_argument("--json", type=Path, default=None,
                        help="where to write every figure (required without a subcommand)")
    parser.add_argument("--fast", action="store_true", help="a small slice (seconds, for smoke checks)")
    parser.add_argument("--seed", type=int, default=0)
    _add_decoding_arguments(parser, None)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    sub = parser.add_subparsers(dest="eval_command", metavar="{blind,unblind,studio,unblind-studio}")
    # the subcommands share --model, --line-book, --seed, --json with plain `flashnpc eval`;
    # SUPPRESS keeps a value given before the subcommand's name
    blind = sub.add_parser("blind", help="write model and book lines, shuffled, for blind rating",
                           description="Write N model lines and M book lines over the same prompt mix, "
                                       "shuffled, to FILE.csv (id, prompt, line, rating) and the hidden "
                                       "key to FILE.key.json.")
    blind.add_argument("--model", type=Path, default=argparse.SUPPRESS, help="exported model directory")
    blind.add_argument("--line-book", type=Path, default=argparse.SUPPRESS, help="line book")
    blind.add_argument("--seed", type=int, default=argparse.SUPPRESS)
    _add_decoding_arguments(blind, argparse.SUPPRESS)
    blind.add_argument("--model-lines", type=int, default=100, help="model lines to rate (default 100)")
    blind.add_argument("--book-lines", type=int, default=50, help="book lines to rate (default 50)")
    blind.add_argument("--versus", type=Path, default=None, metavar="MODEL",
                       help="a second exported model: its lines for the same prompts join the kit "
                            "(source 'versus'), for a blind A/B of two models")
    blind.add_argument("--versus-temperature", type=float, default=None, metavar="T",
                       help="the second model's sampling temperature (default: --temperature), for a "
                            "blind A/B of two decodings of one model (--versus the same directory)")
    blind.add_argument("--versus-top-p", type=float, default=None, metavar="P",
                       help="the second model's nucleus (default: --top-p)")
    blind.add_argument("--out", type=Path, required=True, help="the CSV to write (its key beside it)")
    blind.add_argument("--no-progress", action="store_true", default=argparse.SUPPRESS,
                       help="no progress bar on stderr")
    unblind = sub.add_parser("unblind", help="check a rated file against its key and summarise",
                             description="Read a rated FILE.csv and FILE.key.json; print shippable / "
                                         "clumsy / garbled shares per source, prompt shape and side.")
    unblind.add_argument("file", type=Path, help="the rated CSV")
    unblind.add_argument("--key", type=Path, default=None, help="the key (default: FILE.key.json)")
    unblind.add_argument("--json", type=Path, default=argparse.SUPPRESS, help="also write the summary here")
    studio = sub.add_parser(
        "studio", help="a studio's world: hold out cells, fine-tune, blind sheet against playback",
        description="Hold out a seeded share of a studio line file's (archetype, state, intent) cells, "
                    "fine-tune on the rest, and report, for covered and held-out cells, the share of "
                    "lines played back, generated and fallen back, wrong-move fallbacks, and a blind "
                    "sheet (FlashNPC as served, the model alone, the rule pick, the writers' line). "
                    "Unblind it with: flashnpc eval unblind-studio OUT/sheet.csv")
    studio.add_argument("--lines", type=Path, required=True, help="the studio's line file (CSV or JSONL)")
    studio.add_argument("--out", type=Path, required=True, help="folder for train.jsonl, model/, sheet, report")
    studio.add_argument("--base", type=Path, default=None, help="base model directory (default: shipped)")
    studio.add_argument("--model", type=Path, default=argparse.SUPPRESS,
                        help="a fine-tune of OUT/train.jsonl to reuse instead of fine-tuning again")
    studio.add_argument("--holdout", type=float, default=0.15, help="share of cells held out (default 0.15)")
    studio.add_argument("--covered", type=int, default=40, help="covered cells to sample (default 40)")
    studio.add_argument("--seed", type=int, default=argparse.SUPPRESS)
    studio.add_argument("--epochs", type=float, default=None, help="fine-tune epochs (default: finetune's)")
    studio.add_argument("--steps", type=int, default=None, help="fine-tune steps (overrides --epochs)")
    studio.add_argument("--mode", choices=("adapters", "full"), default=None,
                        help="fine-tune mode (default: finetune's, adapters)")
    studio.add_argument("--replay", type=float, default=None,
                        help="share of each fine-tune batch drawn from the base line book (default: finetune's)")
    studio.add_argument("--threads", type=int, default=None, help="torch threads for the fine-tune")
    studio.add_argument("--json", type=Path, default=argparse.SUPPRESS, help="also write the report here")
    studio.add_argument("--no-progress", action="store_true", default=argparse.SUPPRESS,
                        help="no progress bar on stderr")
    ustudio = sub.add_parser("unblind-studio", help="summarise a rated studio sheet against its key",
                             description="Read a rated OUT/sheet.csv and OUT/sheet.key.json of flashnpc eval "
                                         "studio; print per side and source the rating shares and best-of "
                                         "counts, and FlashNPC against the rule pick request by request.")
    ustudio.add_argument("file", type=Path, help="the rated sheet")
    ustudio.add_argument("--key", type=Path, default=None, help="the key (default: SHEET.key.json)")
    ustudio.add_argument("--json", type=Path, default=argparse.SUPPRESS, help="also write the summary here")


def _add_decoding_arguments(parser: argparse.ArgumentParser, default: Any) -> None:
    """--temperature and --top-p (``default``: None, or SUPPRESS on a subcommand so a value given
    before the subcommand's name is kept)."""
    from runtime.client.sampling import DEFAULT_TEMPERATURE, DEFAULT_TOP_P

    parser.add_argument("--temperature", type=float, default=default, metavar="T",
                        help=f"sampling temperature (default {DEFAULT_TEMPERATURE:g}, the engine's)")
    parser.add_argument("--top-p", type=float, default=default, metavar="P",
                        help=f"nucleus of the sampling (default {DEFAULT_TOP_P:g}, the engine's)")


def _decoding(args: argparse.Namespace, cfg: EvalConfig, prefix: str = "") -> EvalConfig:
    """``cfg`` with the --[PREFIX]temperature / --[PREFIX]top-p given, else the unprefixed ones,
    else ``cfg``'s (checked like the engine's)."""
    from dataclasses import replace

    from runtime.client.constraints import check_sampling

    def given(name: str, default: float) -> float:
        for value in (getattr(args, prefix + name, None), getattr(args, name, None)):
            if value is not None:
                return value
        return default

    out = replace(cfg, temperature=given("temperature", cfg.temperature), top_p=given("top_p", cfg.top_p))
    check_sampling(out.temperature, 0, out.top_p, 1)
    if out.temperature == 0:
        raise ValueError("--temperature must be > 0: the evaluation samples 50 lines a prompt")
    return out


def run_eval(args: argparse.Namespace) -> int:
    command = getattr(args, "eval_command", None)
    if command == "blind":
        return _blind(args)
    if command == "unblind":
        return _unblind(args)
    if command == "studio":
        return _studio(args)
    if command == "unblind-studio":
        return _unblind_studio(args)
    if args.json is None:
        print("flashnpc eval: error: --json OUT is required (or: flashnpc eval blind | unblind)", file=sys.stderr)
        return 2
    if args.model is not None and not args.model.is_dir():
        print(f"flashnpc eval: error: {args.model}: no such model directory", file=sys.stderr)
        return 2
    from runtime.factory.evaluate import EvalConfig, evaluate
    from runtime.factory.linebook import load_line_book
    from runtime.factory.writer_eval import format_writer_table

    cfg = EvalConfig.fast() if args.fast else EvalConfig()
    cfg.seed = args.seed
    try:
        cfg = _decoding(args, cfg)
    except ValueError as exc:
        print(f"flashnpc eval: error: {exc}", file=sys.stderr)
        return 2
    book = load_line_book(args.line_book)
    report = evaluate(args.model, line_book=book, cfg=cfg, progress=lambda m: print(f"· {m}", file=sys.stderr),
                      progress_bar=not args.no_progress)
    from runtime.factory.finetune import eval_section, format_eval_section

    finetuned = report["finetune"] = eval_section(args.model)  # None unless a `flashnpc finetune` output
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
    if finetuned is not None:
        print(format_eval_section(finetuned))
    print(f"{'PASSED' if report['passed'] else 'FAILED'} in {report['seconds']:.0f} s -> {args.json}")
    return 0 if report["passed"] else 1


def _blind(args: argparse.Namespace) -> int:
    from runtime.client.onnx_model import FlashOnnx
    from runtime.factory.blind import key_path, write_blind
    from runtime.factory.evaluate import EvalConfig, Sampler
    from runtime.factory.linebook import load_line_book

    try:
        cfg = _decoding(args, EvalConfig(seed=args.seed))
        versus_cfg = _decoding(args, EvalConfig(seed=args.seed), prefix="versus_")
    except ValueError as exc:
        print(f"flashnpc eval blind: error: {exc}", file=sys.stderr)
        return 2
    if args.versus is None and (args.versus_temperature is not None or args.versus_top_p is not None):
        print("flashnpc eval blind: error: --versus-temperature / --versus-top-p need --versus MODEL "
              "(the same directory as --model for two decodings of one model)", file=sys.stderr)
        return 2
    book = load_line_book(args.line_book)
    sampler = Sampler(FlashOnnx.load(args.model, file="model.int4.onnx"), cfg, book)
    versus = None if args.versus is None else Sampler(FlashOnnx.load(args.versus, file="model.int4.onnx"),
                                                      versus_cfg, book)

    def named(model: Path | None, c: EvalConfig) -> str:
        return f"{model or 'shipped default'} (temperature {c.temperature:g}, top-p {c.top_p:g})"

    try:
        with ticking("eval blind: sampling", enabled=not args.no_progress):
            key = write_blind(args.out, book=book, sampler=sampler, model_lines=args.model_lines,
                              book_lines=args.book_lines, seed=args.seed, model_name=named(args.model, cfg),
                              versus=versus, versus_name=None if args.versus is None else named(args.versus, versus_cfg))
    except ValueError as exc:
        print(f"flashnpc eval blind: {exc}", file=sys.stderr)
        return 2
    print(f"{len(key['items'])} lines to rate -> {args.out} (key: {key_path(args.out)}; keep it from the raters)")
    print(f"rating: {key['rating_scale']}")
    return 0


def _unblind(args: argparse.Namespace) -> int:
    from runtime.factory.blind import format_summary, read_ratings, summarise

    return _summarise_ratings(args, "unblind", lambda: summarise(read_ratings(args.file, args.key)), format_summary)


def _studio(args: argparse.Namespace) -> int:
    from runtime.factory.finetune import FinetuneConfig, FinetuneError
    from runtime.factory.studio_eval import run_studio_eval

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    try:
        given = {k: v for k, v in (("epochs", args.epochs), ("replay", args.replay), ("mode", args.mode))
                 if v is not None}
        cfg = FinetuneConfig(seed=args.seed, steps=args.steps, **given)
        report = run_studio_eval(args.lines, args.out, base=args.base, model=getattr(args, "model", None),
                                 share=args.holdout, n_covered=args.covered, seed=args.seed, cfg=cfg,
                                 progress=not args.no_progress)
    except FinetuneError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        print(f"flashnpc eval studio: error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"flashnpc eval studio: error: {exc}", file=sys.stderr)
        return 2
    for who in ("served", "model_alone"):
        for side, f in report[who].items():
            print(f"{who:11s} {side:9s} {f['requests']:3d} requests: authored {f['authored_pct']}%, "
                  f"near state {f['authored_near_pct']}%, "
                  f"generated {f['generated_pct']}%, fallback {f['fallback_pct']}% "
                  f"(new archetypes {f['new_archetype_fallback_pct']}%), wrong-move fallbacks "
                  f"{f['wrong_move_fallbacks']}")
    todo = report["unwritten_cells"]
    print(f"cells the file does not write: {len(todo)}" + (f" (report.json lists them; first: {', '.join(todo[:3])})"
                                                           if todo else ""))
    print(f"blind sheet -> {report['sheet']} (key beside it; keep it from the raters); "
          f"then: flashnpc eval unblind-studio {report['sheet']}")
    if getattr(args, "json", None) is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def _unblind_studio(args: argparse.Namespace) -> int:
    from runtime.factory.studio_eval import format_summary, read_sheet, summarise_sheet

    return _summarise_ratings(args, "unblind-studio", lambda: summarise_sheet(read_sheet(args.file, args.key)),
                              format_summary)


def _summarise_ratings(args: argparse.Namespace, command: str, summary_of: Any, show: Any) -> int:
    """Print a rated sheet's summary (and write it to --json); every problem of the sheet on
    stderr, one a line, and exit 1 when it cannot be unblinded."""
    from runtime.factory.blind import RatingsError

    try:
        summary = summary_of()
    except RatingsError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        print(f"flashnpc eval {command}: {len(exc.problems)} problem(s); nothing summarised", file=sys.stderr)
        return 1
    print(show(summary))
    if getattr(args, "json", None) is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


# --------------------------------------------------------------------------- flashnpc export [onnx]

def add_export_onnx_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``flashnpc export onnx`` (the ``export`` command itself, with its other
    forms, is :mod:`mobile_export.cli`'s)."""
    parser.add_argument("--model", type=Path, default=DEFAULT_CHECKPOINT, metavar="CKPT",
                        help=f"checkpoint directory from `flashnpc train --out` (default: {DEFAULT_CHECKPOINT})")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR",
                        help="model directory to write (the shipped one is runtime/assets/flash)")
    parser.add_argument("--accuracy-level", type=int, choices=(0, 4), default=4,
                        help="MatMulNBits accuracy_level: 4 = int8 activations (faster), 0 = fp32")
    parser.add_argument("--variant", choices=("qmoe", "gather", "dense"), default="qmoe",
                        help="how INT4 experts run: qmoe (default, sparse), gather (sparse), dense")
    parser.add_argument("--embedding", choices=("fp16", "int4", "fp32"), default="fp16",
                        help="storage of the token embedding table in the INT4 file")
    add_output_arguments(parser)


def run_export_onnx(args: argparse.Namespace) -> int:
    """``flashnpc export onnx``: checkpoint ``--model`` -> model directory ``--out``."""
    try:
        from runtime.factory.export import EXPORT_STAGES, ExportError, export_checkpoint
    except ModuleNotFoundError as exc:
        print(f"flashnpc export onnx: error: exporting needs the train extra ({exc.name} is missing): "
              "pip install -e '.[train]'", file=sys.stderr)
        return 2

    out = args.out
    bar = Progress("export onnx", total=len(EXPORT_STAGES), unit="stage", enabled=not args.no_progress)

    def stage(name: str) -> None:
        if name != EXPORT_STAGES[0]:
            bar.update(1)
        bar.stage(f"export onnx: {name}")

    try:
        with bar:
            info = export_checkpoint(args.model, out, accuracy_level=args.accuracy_level,
                                     moe=args.variant, embedding=args.embedding, progress=stage)
            bar.set(len(EXPORT_STAGES))
    except (ExportError, FileNotFoundError) as exc:
        print(f"flashnpc export onnx: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print_json({"out": str(out), **info})
        return 0
    for name, size in info["files"].items():
        print(f"{out / name}: {size / 1e6:.2f} MB")
    int4 = info["int4"]
    print(f"INT4: {int4['variant']} experts, accuracy_level {int4['accuracy_level']}, "
          f"{int4['embedding']} embedding; onnxruntime {info['onnxruntime_version']}")
    print(f"wrote {out / 'export.json'}")
    return 0


# --------------------------------------------------------------------------- flashnpc finetune

def add_linebook_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="linebook_command", metavar="{lint,schema}")
    lint = sub.add_parser("lint", help="load a line book and list what a writer should look at",
                          description="Load and validate a line book (default: the shipped one); print every "
                                      "lint problem (the fragments' FILE:LINE, the problem, the line), one a "
                                      "line. Exit 1 on a load error (FILE:LINE: FIELD: what), 0 otherwise.")
    lint.add_argument("book", type=Path, nargs="?", default=None, help="a YAML file or a directory of them")
    lint.add_argument("--json", action="store_true", help="the problems as a JSON list")
    schema = sub.add_parser("schema", help="the JSON Schema of a line book file (for YAML editors)",
                            description="Print (or write to --out) the JSON Schema (draft 2020-12) of one line "
                                        "book file, from the format table of runtime/factory/linebook/schema.py.")
    schema.add_argument("--out", type=Path, default=None, help="write it to this file instead of stdout")


def run_linebook(args: argparse.Namespace) -> int:
    command = getattr(args, "linebook_command", None)
    if command == "schema":
        from runtime.factory.linebook.schema import json_schema

        if args.out is None:
            print_json(json_schema())
        else:
            args.out.write_text(json.dumps(json_schema(), indent=2) + "\n")
            print(f"JSON Schema of a line book file -> {args.out}")
        return 0
    if command != "lint":
        args._parser.print_help()
        return 2
    from runtime.factory.linebook import LineBookError, load_line_book

    try:
        book = load_line_book(args.book)
    except LineBookError as exc:
        print(f"flashnpc linebook lint: {exc}", file=sys.stderr)
        return 1
    problems = book.lint()
    if args.json:
        print_json([{"sources": list(p.sources), "problem": p.problem, "text": p.text} for p in problems])
    else:
        for p in problems:
            print(p)
        print(f"{len(problems)} problem(s) in {args.book or 'the shipped line book'}", file=sys.stderr)
    return 0


def add_finetune_arguments(parser: argparse.ArgumentParser) -> None:
    """``flashnpc finetune``'s flags, defined with the fine-tuner (:mod:`runtime.factory.finetune`)."""
    from runtime.factory.finetune import add_arguments

    add_arguments(parser)
    add_output_arguments(parser)


def run_finetune(args: argparse.Namespace) -> int:
    """``flashnpc finetune --base MODEL --lines FILE --out DIR``: see docs/finetune.md."""
    from runtime.factory.finetune import run

    return run(args)
