"""`flashnpc train`: train the Flash line model on a line book.

    flashnpc train --out runs/flash                 # default model, ~25 min on a 2-core CPU
    flashnpc train --out runs/flash --resume        # continue from runs/flash/model.pt
    flashnpc train --out /tmp/t --tiny              # tiny model, a couple of minutes, for smoke tests
    flashnpc train --out runs/x --config '{"n_expert": 8, "steps": 2000}'

``--config`` takes a JSON object (inline or a file path) of FlashConfig and/or
TrainConfig fields. The tokenizer is trained on the training split's lines unless
DIR already holds a tokenizer.json.
"""

from __future__ import annotations

import os

# Spinning OpenMP workers lose badly on a shared, oversubscribed CPU (measured 2-10x
# slower steps); passive waiting costs little when the machine is idle. Must be set
# before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is an extra: `flashnpc` must start without it
    from runtime.model import FlashConfig
    from runtime.train import TrainConfig

# Small enough to train in a couple of minutes on the CPU; used by --tiny and tests.
TINY_MODEL = dict(vocab_size=512, block_size=96, n_layer=2, n_head=2, n_embd=64, n_expert=8,
                  expert_hidden=64, top_k=1)
TINY_TRAIN = dict(steps=200, batch_size=16, lr=3e-3, min_lr=3e-4, warmup_steps=20,
                  eval_interval=50, eval_examples=128, checkpoint_interval=50)


def add_arguments(parser: argparse.ArgumentParser) -> None:
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
    parser.add_argument("--seed", type=int, default=None, metavar="N", help="seed for init and data order (default 0)")
    parser.add_argument("--tiny", action="store_true", help="tiny model and schedule, for smoke tests")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="CPU threads for torch (default: all cores, at most 8)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


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
    from runtime.model import FlashConfig
    from runtime.train import TrainConfig, split_overrides

    model_kw: dict[str, Any] = dict(TINY_MODEL) if args.tiny else {}
    train_kw: dict[str, Any] = dict(TINY_TRAIN) if args.tiny else {}
    user_model, user_train = split_overrides(load_overrides(args.config))
    model_kw.update(user_model)
    train_kw.update(user_train)
    for key, value in (("steps", args.steps), ("batch_size", args.batch_size), ("seed", args.seed)):
        if value is not None:
            train_kw[key] = value
    return FlashConfig(**model_kw), TrainConfig(**train_kw)


def run(args: argparse.Namespace) -> int:
    try:
        import torch
    except ModuleNotFoundError:
        print("flashnpc train: error: training needs torch: "
              "pip install torch==2.13.0 && pip install -e '.[train]'", file=sys.stderr)
        return 2
    from runtime.train import train

    try:
        model_cfg, train_cfg = build_configs(args)
    except (ValueError, TypeError) as exc:
        print(f"flashnpc train: error: {exc}", file=sys.stderr)
        return 2
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("flashnpc train: error: --device cuda but no CUDA GPU is available", file=sys.stderr)
        return 2
    if device == "cpu":
        torch.set_num_threads(args.threads or min(os.cpu_count() or 1, 8))

    from runtime.linebook import LineBookError, load_line_book
    from runtime.tokenizer import Tokenizer, train_tokenizer

    try:
        book = load_line_book(args.line_book)
    except (LineBookError, FileNotFoundError) as exc:
        print(f"flashnpc train: error: {exc}", file=sys.stderr)
        return 2
    split = book.split()
    out = Path(args.out)
    tok_path = out / "tokenizer.json"
    if tok_path.exists():
        tokenizer = Tokenizer.load(tok_path)
        print(f"tokenizer: loaded {tok_path} (vocab {tokenizer.vocab_size})")
    else:
        tokenizer = train_tokenizer([ex.text for ex in split.train], book.catalog(),
                                    vocab_size=model_cfg.vocab_size)
        print(f"tokenizer: trained on {len(split.train)} training lines (vocab {tokenizer.vocab_size})")

    resume = args.resume and (out / "model.pt").exists()
    if args.resume and not resume:
        print(f"no checkpoint in {out}; starting fresh")
    # on resume the saved schedule is kept unless settings were given on the command line
    train_config = None if resume and not _train_settings_given(args) else train_cfg
    try:
        log = train(out, train_examples=split.train, val_examples=split.val, tokenizer=tokenizer,
                    catalog=book.catalog(), model_config=model_cfg, train_config=train_config,
                    device=device, resume=resume, progress=not args.quiet)
    except KeyboardInterrupt:
        print(f"\ninterrupted; checkpoint saved in {out}, continue with --resume", file=sys.stderr)
        return 130
    counts = log["num_params"]
    final = log["final"]
    print(
        f"done: step {final['step']}, params {counts['total']:,} total / "
        f"{counts['active_per_token']:,} active per token; val CE fp32 {final['val_ce_fp32']:.3f}, "
        f"int4 {final['val_ce_int4']:.3f}; {final['tokens_per_s_this_run']:.0f} tokens/s; wrote {out}"
    )
    return 0


def _train_settings_given(args: argparse.Namespace) -> bool:
    return any(v is not None for v in (args.steps, args.batch_size, args.seed, args.config)) or args.tiny
