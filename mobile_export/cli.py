"""mobile_export's commands: ``flashnpc export`` (its three forms) and ``flashnpc bundle``.

``flashnpc export [onnx|mobile|client] ...``: a trained model to ONNX, a mobile bundle, or a client.

``flashnpc export [--model CKPT] [--out DIR] [--accuracy-level 0|4]`` (or ``export onnx``):
checkpoint -> model directory; the runtime's model factory does it (:func:`runtime.cli.run_export_onnx`).

``flashnpc export mobile --out DIR [--model MODEL_DIR] [--zip] [--target arm|x86] [--force]``:
model directory (default: the shipped one) -> verified bundle for mobile/desktop builds
(ORT-format model, tokenizer, fallbacks, manifest.json; see docs/mobile.md).

``flashnpc export client --out DIR [--model MODEL_DIR | --bundle PATH] [--force]``: a
PyInstaller one-dir build of the offline demo client with the bundle inside (needs the
``build`` extra: ``pip install 'flashnpc[build]'``).

The command lives here, downstream of the runtime, because two of its forms are this
package's; the runtime never imports mobile_export.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from runtime.cli import DEFAULT_CHECKPOINT, add_export_onnx_arguments, run_export_onnx

__all__ = ["add_bundle_arguments", "add_export_arguments", "run_bundle", "run_export"]

FORMS = ("onnx", "mobile", "client")

BUNDLE_DOC = """``flashnpc bundle verify | sign | keygen``: check, sign, and make signing keys for bundles.

``flashnpc bundle verify PATH [--reference MODEL_DIR] [--onnxruntime VERSION]... [--public-key KEY] [--json]``
checks a model bundle. Exit status 0 only when the manifest, every file's size and hash, the
size budget and the fresh-process generation check all hold (see :mod:`mobile_export.verify`);
1 when the bundle is rejected; 2 for a bad argument. The report says which check failed and
why. The generation check runs under the installed onnxruntime and, once per
``--onnxruntime VERSION``, under that version too (installed on demand into a private cache).
``--public-key KEY`` (PEM file or 64 hex digits) also requires that key's signature.

``flashnpc bundle keygen --out KEY`` writes an Ed25519 key pair (KEY private, KEY.pub public);
``flashnpc bundle sign PATH --key KEY`` signs a bundle in place (``manifest.sig``). Both need
``pip install 'flashnpc[sign]'``.
"""

# --------------------------------------------------------------------------- flashnpc export


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
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
    add_export_onnx_arguments(parser.add_argument_group("onnx"))
    mobile = parser.add_argument_group("mobile / client")
    mobile.add_argument("--target", choices=("arm", "x86"), default=None,
                        help="CPU the ORT model's fixed optimisations are for (default: arm for "
                             "mobile, this machine's for client)")
    mobile.add_argument("--zip", action="store_true", help="mobile: write one zip archive (OUT.zip)")
    mobile.add_argument("--genai", action="store_true",
                        help="mobile: also make the bundle an onnxruntime-genai model folder (genai/, "
                             "holding the one model.ort; docs/mobile.md section 9)")
    mobile.add_argument("--onnxruntime", default=None, metavar="VERSION",
                        help="mobile: the onnxruntime release that writes model.ort; the game's must be "
                             "that or newer (default: 1.27.0, installed on demand into a private cache)")
    mobile.add_argument("--force", action="store_true", help="replace an existing OUT")
    mobile.add_argument("--bundle", type=Path, default=None,
                        help="client: package this bundle instead of exporting one from --model")


def run_export(args: argparse.Namespace) -> int:
    if args.what == "onnx":
        return run_export_onnx(args)
    if args.out is None:
        print(f"flashnpc export {args.what}: --out is required", file=sys.stderr)
        return 2
    from mobile_export.client import ClientBuildError
    from runtime.client.bundle import BundleError
    from runtime.paths import DEFAULT_MODEL_DIR

    model = args.model if args.model is not None else DEFAULT_MODEL_DIR
    try:
        if args.what == "mobile":
            from mobile_export.bundle import export_bundle
            from mobile_export.toolchain import DEFAULT_ONNXRUNTIME

            done = export_bundle(model, args.out, target=args.target or "arm", zip_output=args.zip,
                                 force=args.force, onnxruntime=args.onnxruntime or DEFAULT_ONNXRUNTIME,
                                 genai=args.genai)
            for entry in done.manifest["files"]:
                print(f"  {entry['path']}: {entry['size'] / 1e6:.3f} MB")
            size = f"{done.total_bytes / 1e6:.2f} MB" + (
                f" ({done.zip_bytes / 1e6:.2f} MB zipped)" if done.zip_bytes is not None else "")
            print(f"wrote {done.path}: {size}, target {done.manifest['model']['target']}, model.ort "
                  f"written by onnxruntime {done.manifest['onnxruntime']['built_with']} (the game's must be "
                  "that or newer); "
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


# --------------------------------------------------------------------------- flashnpc bundle


def add_bundle_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bundle_command", metavar="ACTION", required=True)
    verify = sub.add_parser("verify", help="check a bundle (directory or zip) end to end",
                            description=BUNDLE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    verify.add_argument("path", type=Path, help="bundle directory or zip from `flashnpc export mobile`")
    verify.add_argument("--reference", type=Path, default=None, metavar="MODEL_DIR",
                        help="compare with the Python runtime's lines generated now from this model "
                             "directory instead of those recorded in the bundle")
    verify.add_argument("--onnxruntime", action="append", default=[], metavar="VERSION",
                        help="also replay the reference lines under this onnxruntime release (e.g. "
                             "the one the game ships; repeatable)")
    verify.add_argument("--public-key", default=None, metavar="KEY",
                        help="require this Ed25519 key's signature (a PEM file, or 64 hex digits)")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    sign = sub.add_parser("sign", help="sign a bundle in place with an Ed25519 private key")
    sign.add_argument("path", type=Path, help="bundle directory or zip")
    sign.add_argument("--key", type=Path, required=True, help="PEM private key from `flashnpc bundle keygen`")
    keygen = sub.add_parser("keygen", help="write a new Ed25519 key pair for signing bundles")
    keygen.add_argument("--out", type=Path, required=True, help="private key file (the public key goes to OUT.pub)")
    keygen.add_argument("--force", action="store_true", help="replace existing key files")


def run_bundle(args: argparse.Namespace) -> int:
    import sys

    from runtime.client.bundle import BundleError

    try:
        if args.bundle_command == "keygen":
            from mobile_export.signing import generate_key

            private, public = generate_key(args.out, force=args.force)
            print(f"wrote {private} (private: keep it out of the game) and {public} (public: ship it "
                  "with the game, LineGenerator.load(bundle, public_key=...))")
            return 0
        if args.bundle_command == "sign":
            from mobile_export.signing import sign_bundle

            print(f"signed {args.path} with key {sign_bundle(args.path, args.key)}")
            return 0
        return _verify(args)
    except BundleError as exc:
        print(f"flashnpc bundle {args.bundle_command}: {exc}", file=sys.stderr)
        return 2


def _verify(args: argparse.Namespace) -> int:
    from mobile_export.toolchain import check_version
    from mobile_export.verify import verify_bundle
    from runtime.client.signature import raw_public_key

    versions = [check_version(v) for v in args.onnxruntime]
    key = None
    if args.public_key is not None:
        as_file = Path(args.public_key)
        key = raw_public_key(as_file if as_file.is_file() else args.public_key)
    report = verify_bundle(args.path, reference_dir=args.reference, onnxruntime=[None, *versions],
                           public_key=key)
    if args.json:
        print(json.dumps({"path": str(report.path), "ok": report.ok,
                          "checks": [vars(c) for c in report.checks], "worker": report.worker,
                          "workers": report.workers}, indent=2))
    else:
        print(report.render())
    return 0 if report.ok else 1
