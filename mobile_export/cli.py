"""mobile_export's commands: ``flashnpc export`` (its four forms) and ``flashnpc bundle``.

``flashnpc export FORM ...``: one subcommand per form, each with only its own flags (a flag of
another form is an error). A bare ``flashnpc export`` prints the forms and exits 2: no form
writes anywhere without ``--out``.

``flashnpc export onnx --model CKPT --out DIR [--accuracy-level 0|4] [--variant ...] [--embedding ...]``:
checkpoint -> model directory; the runtime's model factory does it
(:func:`runtime.cli.add_export_onnx_arguments`, :func:`runtime.cli.run_export_onnx`).

``flashnpc export mobile --out DIR [--model MODEL_DIR] [--zip] [--target arm|x86] [--genai]
[--onnxruntime VERSION] [--force]``: model directory (default: the shipped one) -> verified
bundle for mobile/desktop builds (ORT-format model, tokenizer, fallbacks, manifest.json; see
docs/mobile.md).

``flashnpc export client --out DIR [--model MODEL_DIR | --bundle PATH] [--target arm|x86] [--force]``:
a PyInstaller one-dir build of the offline demo client with the bundle inside (needs the
``build`` extra: ``pip install 'flashnpc[build]'``).

``flashnpc export genai --out DIR [--model MODEL_DIR] [--force]``: an onnxruntime-genai model
folder (:func:`mobile_export.genai.write_genai_folder`; docs/mobile.md section 9).

Every form takes ``--json`` (the result as JSON on stdout) and ``--no-progress``. Errors in the
inputs (a missing model, an existing ``--out`` without ``--force``) exit 2 with one line.

The command lives here, downstream of the runtime, because three of its forms are this
package's; the runtime never imports mobile_export.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from runtime.cli import add_export_onnx_arguments, add_output_arguments, run_export_onnx
from runtime.console import print_json, ticking

__all__ = ["EXPECTED_ERRORS", "add_bundle_arguments", "add_export_arguments", "run_bundle", "run_export"]

FORMS = ("onnx", "mobile", "client", "genai")

# errors the `flashnpc` dispatcher reports as one line (module:class, resolved once loaded)
EXPECTED_ERRORS = ("runtime.client.errors:ModelLoadError", "mobile_export.client:ClientBuildError")

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

def _form(sub: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A subparser that reports a flag of another form as its own error (plugin.cli.main)."""
    form: argparse.ArgumentParser = sub.add_parser(name, **kwargs)
    form.set_defaults(_parser=form)
    return form


def _model_argument(parser: Any, what: str = "exported model directory") -> None:
    parser.add_argument("--model", type=Path, default=None, metavar="MODEL_DIR",
                        help=f"{what} (default: the shipped runtime/assets/flash)")


def _out_arguments(parser: argparse.ArgumentParser, out_help: str) -> None:
    """``--out`` (required), ``--force``, ``--json`` and ``--no-progress``."""
    parser.add_argument("--out", type=Path, required=True, help=out_help)
    parser.add_argument("--force", action="store_true", help="replace an existing OUT")
    add_output_arguments(parser)


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """``flashnpc export``: one subparser per form (see the module docstring)."""
    parser.set_defaults(_export_parser=parser)
    sub = parser.add_subparsers(dest="export_form", metavar="FORM", title="forms")
    onnx = _form(sub, "onnx", help="checkpoint -> ONNX model directory (fp32 reference + shipped INT4)",
                 description="Export a checkpoint from `flashnpc train --out` to a model directory: "
                             "model.onnx (fp32 reference), model.int4.onnx (shipped), side files.")
    add_export_onnx_arguments(onnx)

    mobile = _form(sub, "mobile", help="model directory -> verified bundle for mobile/desktop builds",
                   description="Write a verified ORT-format bundle of a model directory for mobile and "
                               "desktop builds (docs/mobile.md).")
    _model_argument(mobile)
    mobile.add_argument("--target", choices=("arm", "x86"), default="arm",
                        help="CPU the ORT model's fixed optimisations are for (default: arm)")
    mobile.add_argument("--zip", action="store_true", help="write one zip archive (OUT.zip)")
    mobile.add_argument("--genai", action="store_true",
                        help="also make the bundle an onnxruntime-genai model folder (genai/, holding "
                             "the one model.ort; docs/mobile.md section 9)")
    mobile.add_argument("--onnxruntime", default=None, metavar="VERSION",
                        help="the onnxruntime release that writes model.ort; the game's must be that or "
                             "newer (default: 1.27.0, installed on demand into a private cache)")
    _out_arguments(mobile, "bundle directory (with --zip: OUT.zip)")

    client = _form(sub, "client", help="packaged offline demo client (PyInstaller) with the bundle inside",
                   description="Build a PyInstaller one-dir offline demo client with a model bundle inside "
                               "(needs pip install 'flashnpc[build]').")
    source = client.add_mutually_exclusive_group()
    _model_argument(source, "export the bundle from this model directory")
    source.add_argument("--bundle", type=Path, default=None, help="package this bundle instead")
    client.add_argument("--target", choices=("arm", "x86"), default=None,
                        help="CPU of the bundle exported from --model (default: this machine's)")
    _out_arguments(client, "build directory")

    genai = _form(sub, "genai", help="model directory -> onnxruntime-genai model folder",
                  description="Write an onnxruntime-genai model folder (genai_config.json, Hugging Face "
                              "tokenizer, the INT4 graph, side files; docs/mobile.md section 9).")
    _model_argument(genai)
    _out_arguments(genai, "folder to write")


def run_export(args: argparse.Namespace) -> int:
    """Run the form ``args.export_form``; a bare ``flashnpc export`` prints the forms, exit 2."""
    form = getattr(args, "export_form", None)
    if form is None:
        args._export_parser.print_help(sys.stderr)
        print(f"\nflashnpc export: error: choose a form: {', '.join(FORMS)} "
              "(e.g. flashnpc export mobile --out build/bundle)", file=sys.stderr)
        return 2
    if form == "onnx":
        return run_export_onnx(args)
    from mobile_export.client import ClientBuildError
    from runtime.client.bundle import BundleError
    from runtime.paths import DEFAULT_MODEL_DIR

    model = args.model if getattr(args, "model", None) is not None else DEFAULT_MODEL_DIR
    try:
        with ticking(f"export {form}", enabled=not args.no_progress):
            data, text = _EXPORTERS[form](args, model)
    except (BundleError, ClientBuildError, FileNotFoundError) as exc:  # GenaiExportError is a BundleError
        print(f"flashnpc export {form}: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print_json(data)
    else:
        print(text)
    return 0


def _export_mobile(args: argparse.Namespace, model: Path) -> tuple[dict[str, Any], str]:
    from mobile_export.bundle import export_bundle
    from mobile_export.toolchain import DEFAULT_ONNXRUNTIME

    done = export_bundle(model, args.out, target=args.target, zip_output=args.zip, force=args.force,
                         onnxruntime=args.onnxruntime or DEFAULT_ONNXRUNTIME, genai=args.genai)
    rows = [f"  {e['path']}: {e['size'] / 1e6:.3f} MB" for e in done.manifest["files"]]
    size = f"{done.total_bytes / 1e6:.2f} MB" + (
        f" ({done.zip_bytes / 1e6:.2f} MB zipped)" if done.zip_bytes is not None else "")
    rows.append(f"wrote {done.path}: {size}, target {done.manifest['model']['target']}, model.ort written "
                f"by onnxruntime {done.manifest['onnxruntime']['built_with']} (the game's must be that or "
                f"newer); check it with `flashnpc bundle verify {done.path}`")
    data = {"path": str(done.path), "total_bytes": done.total_bytes, "zip_bytes": done.zip_bytes,
            "manifest": done.manifest}
    return data, "\n".join(rows)


def _export_client(args: argparse.Namespace, model: Path) -> tuple[dict[str, Any], str]:
    from mobile_export.client import build_client, host_target

    built = build_client(args.out, model_dir=model, bundle=args.bundle, target=args.target or host_target(),
                         force=args.force)
    data = {"directory": str(built.directory), "executable": str(built.executable),
            "size_bytes": built.size_bytes, "build_s": built.build_s}
    return data, (f"wrote {built.directory} ({built.size_bytes / 1e6:.1f} MB, built in {built.build_s:.0f} s); "
                  f"run {built.executable} demo")


def _export_genai(args: argparse.Namespace, model: Path) -> tuple[dict[str, Any], str]:
    from mobile_export.genai import write_genai_folder

    folder = write_genai_folder(args.model, args.out, force=args.force)
    files = {p.relative_to(folder).as_posix(): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}
    rows = [f"  {name}: {size / 1e6:.3f} MB" for name, size in files.items()]
    rows.append(f"wrote {folder}: {sum(files.values()) / 1e6:.2f} MB, an onnxruntime-genai model folder "
                "(docs/mobile.md section 9)")
    return {"path": str(folder), "files": files}, "\n".join(rows)


_EXPORTERS = {"mobile": _export_mobile, "client": _export_client, "genai": _export_genai}


# --------------------------------------------------------------------------- flashnpc bundle


def add_bundle_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bundle_command", metavar="ACTION", required=True)
    verify = _form(sub, "verify", help="check a bundle (directory or zip) end to end",
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
    add_output_arguments(verify)
    sign = _form(sub, "sign", help="sign a bundle in place with an Ed25519 private key")
    sign.add_argument("path", type=Path, help="bundle directory or zip")
    sign.add_argument("--key", type=Path, required=True, help="PEM private key from `flashnpc bundle keygen`")
    keygen = _form(sub, "keygen", help="write a new Ed25519 key pair for signing bundles")
    keygen.add_argument("--out", type=Path, required=True, help="private key file (the public key goes to OUT.pub)")
    keygen.add_argument("--force", action="store_true", help="replace existing key files")


def run_bundle(args: argparse.Namespace) -> int:
    """``flashnpc bundle verify | sign | keygen``: exit 0 done, 1 a rejected bundle, 2 bad input."""
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
        print(f"flashnpc bundle {args.bundle_command}: error: {exc}", file=sys.stderr)
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
    with ticking(f"verify {args.path}", enabled=not args.no_progress):
        report = verify_bundle(args.path, reference_dir=args.reference, onnxruntime=[None, *versions],
                               public_key=key)
    if args.json:
        print_json({"path": str(report.path), "ok": report.ok, "checks": [vars(c) for c in report.checks],
                    "worker": report.worker, "workers": report.workers})
    else:
        print(report.render())
    return 0 if report.ok else 1
