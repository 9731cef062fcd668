"""`flashnpc export [onnx|mobile|client] ...`: a trained model to ONNX, a mobile bundle, or a client.

``flashnpc export [--model CKPT] [--out DIR] [--accuracy-level 0|4]`` (or ``export onnx``):
checkpoint -> model directory. Writes ``model.onnx`` (fp32 reference), ``model.int4.onnx``
(shipped: INT4, truly sparse experts), copies tokenizer.json / config.json / catalog.json (and
fallbacks.json, or builds it from the default line book), and writes ``export.json``.

``flashnpc export mobile --out DIR [--model MODEL_DIR] [--zip] [--target arm|x86] [--force]``:
model directory (default: the shipped one) -> verified bundle for mobile/desktop builds
(ORT-format model, tokenizer, fallbacks, manifest.json; see docs/mobile.md).

``flashnpc export client --out DIR [--model MODEL_DIR | --bundle PATH] [--force]``: a
PyInstaller one-dir build of the offline demo client with the bundle inside (needs the
``build`` extra: ``pip install 'flashnpc[build]'``).

The mobile and client forms are implemented by :mod:`mobile_export`, imported only for them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_CHECKPOINT = Path("runs/flash")
FORMS = ("onnx", "mobile", "client")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", nargs="?", choices=FORMS, default="onnx",
                        help="onnx (default): checkpoint -> ONNX model directory; mobile: model "
                             "directory -> bundle; client: packaged offline demo client")
    parser.add_argument("--model", type=Path, default=None,
                        help=f"onnx: checkpoint directory from `flashnpc train --out` (default: "
                             f"{DEFAULT_CHECKPOINT}); mobile/client: exported model directory "
                             "(default: the shipped runtime/assets/flash)")
    parser.add_argument("--out", type=Path, default=None,
                        help="onnx: model directory to write (default: the shipped runtime/assets/flash); "
                             "mobile: bundle directory (or zip with --zip); client: build directory")
    onnx = parser.add_argument_group("onnx")
    onnx.add_argument("--accuracy-level", type=int, choices=(0, 4), default=4,
                      help="MatMulNBits accuracy_level: 4 = int8 activations (faster), 0 = fp32")
    onnx.add_argument("--variant", choices=("qmoe", "gather", "dense"), default="qmoe",
                      help="how INT4 experts run: qmoe (default, sparse), gather (sparse), dense")
    onnx.add_argument("--embedding", choices=("fp16", "int4", "fp32"), default="fp16",
                      help="storage of the token embedding table in the INT4 file")
    mobile = parser.add_argument_group("mobile / client")
    mobile.add_argument("--target", choices=("arm", "x86"), default=None,
                        help="CPU the ORT model's fixed optimisations are for (default: arm for "
                             "mobile, this machine's for client)")
    mobile.add_argument("--zip", action="store_true", help="mobile: write one zip archive (OUT.zip)")
    mobile.add_argument("--force", action="store_true", help="replace an existing OUT")
    mobile.add_argument("--bundle", type=Path, default=None,
                        help="client: package this bundle instead of exporting one from --model")


def run(args: argparse.Namespace) -> int:
    if args.what == "onnx":
        return _run_onnx(args)
    if args.out is None:
        print(f"flashnpc export {args.what}: --out is required", file=sys.stderr)
        return 2
    from mobile_export.client import ClientBuildError
    from runtime.bundle import BundleError
    from runtime.paths import DEFAULT_MODEL_DIR

    model = args.model if args.model is not None else DEFAULT_MODEL_DIR
    try:
        if args.what == "mobile":
            from mobile_export.bundle import export_bundle

            done = export_bundle(model, args.out, target=args.target or "arm", zip_output=args.zip,
                                 force=args.force)
            for entry in done.manifest["files"]:
                print(f"  {entry['path']}: {entry['size'] / 1e6:.3f} MB")
            size = f"{done.total_bytes / 1e6:.2f} MB" + (
                f" ({done.zip_bytes / 1e6:.2f} MB zipped)" if done.zip_bytes is not None else "")
            print(f"wrote {done.path}: {size}, target {done.manifest['model']['target']}; "
                  f"check it with `flashnpc bundle verify {done.path}`")
            return 0
        from mobile_export.client import build_client, host_target

        built = build_client(args.out, model_dir=model, bundle=args.bundle,
                             target=args.target or host_target(), force=args.force)
        print(f"wrote {built.directory} ({built.size_bytes / 1e6:.1f} MB, built in {built.build_s:.0f} s); "
              f"run {built.executable} demo")
        return 0
    except (BundleError, ClientBuildError, FileNotFoundError) as exc:
        print(f"flashnpc export {args.what}: {exc}", file=sys.stderr)
        return 2


def _run_onnx(args: argparse.Namespace) -> int:
    from runtime.export import ExportError, export_checkpoint
    from runtime.paths import DEFAULT_MODEL_DIR

    model = args.model if args.model is not None else DEFAULT_CHECKPOINT
    out = args.out if args.out is not None else DEFAULT_MODEL_DIR
    try:
        info = export_checkpoint(model, out, accuracy_level=args.accuracy_level,
                                 moe=args.variant, embedding=args.embedding)
    except (ExportError, FileNotFoundError) as exc:
        print(f"flashnpc export: {exc}", file=sys.stderr)
        return 2
    for name, size in info["files"].items():
        print(f"{out / name}: {size / 1e6:.2f} MB")
    int4 = info["int4"]
    print(f"INT4: {int4['variant']} experts, accuracy_level {int4['accuracy_level']}, "
          f"{int4['embedding']} embedding; onnxruntime {info['onnxruntime_version']}")
    print(f"wrote {out / 'export.json'}")
    return 0
