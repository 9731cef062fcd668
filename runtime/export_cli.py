"""`flashnpc export [--model DIR] [--out DIR] [--accuracy-level 0|4]`: checkpoint -> ONNX model directory.

Writes ``model.onnx`` (fp32 reference), ``model.int4.onnx`` (shipped: INT4, truly sparse
experts), copies tokenizer.json / config.json / catalog.json (and fallbacks.json, or builds it
from the default line book), and writes ``export.json`` describing what was written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_CHECKPOINT = Path("runs/flash")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from runtime.paths import DEFAULT_MODEL_DIR

    parser.add_argument("--model", type=Path, default=DEFAULT_CHECKPOINT,
                        help=f"checkpoint directory from `flashnpc train --out` (default: {DEFAULT_CHECKPOINT})")
    parser.add_argument("--out", type=Path, default=DEFAULT_MODEL_DIR,
                        help="model directory to write (default: the shipped runtime/assets/flash)")
    parser.add_argument("--accuracy-level", type=int, choices=(0, 4), default=4,
                        help="MatMulNBits accuracy_level: 4 = int8 activations (faster), 0 = fp32")
    parser.add_argument("--variant", choices=("qmoe", "gather", "dense"), default="qmoe",
                        help="how INT4 experts run: qmoe (default, sparse), gather (sparse), dense")
    parser.add_argument("--embedding", choices=("fp16", "int4", "fp32"), default="fp16",
                        help="storage of the token embedding table in the INT4 file")


def run(args: argparse.Namespace) -> int:
    from runtime.export import ExportError, export_checkpoint

    try:
        info = export_checkpoint(args.model, args.out, accuracy_level=args.accuracy_level,
                                 moe=args.variant, embedding=args.embedding)
    except (ExportError, FileNotFoundError) as exc:
        print(f"flashnpc export: {exc}", file=sys.stderr)
        return 2
    for name, size in info["files"].items():
        print(f"{args.out / name}: {size / 1e6:.2f} MB")
    int4 = info["int4"]
    print(f"INT4: {int4['variant']} experts, accuracy_level {int4['accuracy_level']}, "
          f"{int4['embedding']} embedding; onnxruntime {info['onnxruntime_version']}")
    print(f"wrote {args.out / 'export.json'}")
    return 0
