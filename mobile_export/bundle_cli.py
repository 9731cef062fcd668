"""``flashnpc bundle verify PATH [--reference MODEL_DIR] [--json]``: check a model bundle.

Exit status 0 only when the manifest, every file's size and hash, the size budget and the
fresh-process generation check all hold (see :mod:`mobile_export.verify`); 1 when the bundle
is rejected. The report says which check failed and why.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bundle_command", metavar="ACTION", required=True)
    verify = sub.add_parser("verify", help="check a bundle (directory or zip) end to end",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verify.add_argument("path", type=Path, help="bundle directory or zip from `flashnpc export mobile`")
    verify.add_argument("--reference", type=Path, default=None, metavar="MODEL_DIR",
                        help="compare with the Python runtime's lines generated now from this model "
                             "directory instead of those recorded in the bundle")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from mobile_export.verify import verify_bundle

    report = verify_bundle(args.path, reference_dir=args.reference)
    if args.json:
        print(json.dumps({"path": str(report.path), "ok": report.ok,
                          "checks": [vars(c) for c in report.checks], "worker": report.worker}, indent=2))
    else:
        print(report.render())
    return 0 if report.ok else 1
