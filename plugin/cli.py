"""The `flashnpc` command line.

Each subcommand lives with the package that owns it: the package exposes a
module with ``add_arguments(parser)`` and ``run(args) -> int``. This file only
dispatches, importing the owning module lazily so ``flashnpc bt ...`` never
imports torch or onnxruntime.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("plugin.demo_cli", "run the headless NPC demo (the main job)"),
    "bt": ("behavior_tree.cli", "behavior trees: validate, render, demo"),
    "train": ("runtime.train_cli", "train the Flash line model"),
    "eval": ("runtime.eval_cli", "evaluate a Flash model"),
    "export": ("runtime.export_cli", "export a trained model to ONNX / INT4, or a mobile bundle / packaged client"),
    "bundle": ("mobile_export.bundle_cli", "check model bundles: flashnpc bundle verify PATH"),
    "serve": ("server_sync.serve_cli", "run the authoritative world server"),
    "loadtest": ("server_sync.loadtest_cli", "load-test a server on loopback"),
    "inspect": ("plugin.inspect_cli", "live web inspector of a running world"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flashnpc", description="FlashNPC: NPC dialogue plugin")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # subcommand not built yet
        module.add_arguments(sub.add_parser(name, help=help_text, description=help_text))
        sub.choices[name].set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_module", None):
        parser.print_help()
        return 2
    return int(args._module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
