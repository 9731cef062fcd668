"""The `flashnpc` command line, and plugin's own commands (``demo``, ``inspect``).

Each subcommand lives with the package that owns it, in the package's ``cli.py``: for a
command NAME, the module exposes ``add_NAME_arguments(parser)`` and ``run_NAME(args) -> int``
(behavior_tree's ``cli.py``, one command, exposes ``add_arguments`` and ``run``). This file
dispatches, importing the owning module lazily so ``flashnpc bt ...`` never imports torch or
onnxruntime.

``flashnpc demo``: the main job, a headless day and night in the example village
(:func:`plugin.demo.run_village`). ``flashnpc inspect``: the village live, with the web
inspector (:func:`plugin.demo.serve_village`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from typing import Any

# subcommand -> (module, function prefix: add_<prefix>_arguments / run_<prefix>, or "" for
# add_arguments / run; one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "demo": ("plugin.cli", "demo", "run the headless NPC demo (the main job)"),
    "bt": ("behavior_tree.cli", "", "behavior trees: validate, render, demo"),
    "train": ("runtime.cli", "train", "train the Flash line model"),
    "eval": ("runtime.cli", "eval", "evaluate a Flash model"),
    "finetune": ("runtime.cli", "finetune", "fine-tune a Flash model on a studio's own lines"),
    "export": ("mobile_export.cli", "export",
               "export a trained model to ONNX / INT4, or a mobile bundle / packaged client"),
    "bundle": ("mobile_export.cli", "bundle", "check model bundles: flashnpc bundle verify PATH"),
    "serve": ("server_sync.cli", "serve", "run the authoritative world server"),
    "loadtest": ("server_sync.cli", "loadtest", "load-test a server on loopback"),
    "inspect": ("plugin.cli", "inspect", "live web inspector of a running world"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flashnpc", description="FlashNPC: NPC dialogue plugin")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, prefix, help_text) in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # subcommand not built yet
        add = getattr(module, f"add_{prefix}_arguments" if prefix else "add_arguments")
        add(sub.add_parser(name, help=help_text, description=help_text))
        sub.choices[name].set_defaults(_run=getattr(module, f"run_{prefix}" if prefix else "run"))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    return int(args._run(args) or 0)


# --------------------------------------------------------------------------- flashnpc demo

def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0, help="seed of the tree phases and line sampling")
    parser.add_argument("--npcs", type=int, default=10, help="villagers along the street (default 10)")
    parser.add_argument("--duration", type=float, default=120.0,
                        help="game seconds the walk takes: half by day, half by night (default 120)")
    parser.add_argument("--fps", type=float, default=10.0, help="simulated frames per game second")
    parser.add_argument("--model", default=None, help="model directory (default: the shipped model)")
    parser.add_argument("--states", action="store_true", help="also print every state change")


def run_demo(args: argparse.Namespace) -> int:
    if args.npcs < 1:
        print("error: --npcs must be at least 1", file=sys.stderr)
        return 2
    if not args.duration > 0 or not args.fps > 0:
        print("error: --duration and --fps must be positive", file=sys.stderr)
        return 2
    from .demo import run_village

    gen = load_generator(args.model)
    if gen is None:
        return 1
    try:
        run_village(gen, seed=args.seed, npcs=args.npcs, duration=args.duration, fps=args.fps,
                    show_states=args.states)
    finally:
        gen.close()
    return 0


def load_generator(model: str | None) -> Any:
    """The line engine for ``--model`` (None: the shipped model), or None after printing why
    it could not load."""
    from runtime import LineGenerator, ModelLoadError

    try:
        return LineGenerator.load(model)
    except ModelLoadError as exc:
        print(f"error: cannot load the model: {exc}", file=sys.stderr)
        return None


# --------------------------------------------------------------------------- flashnpc inspect

def add_inspect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--npcs", type=int, default=10, help="villagers (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--day", type=float, default=120.0,
                        help="seconds one day-and-night walk takes (default 120)")
    parser.add_argument("--fps", type=float, default=30.0, help="world updates per second")
    parser.add_argument("--duration", type=float, default=0.0,
                        help="stop after this many seconds (default 0: run until interrupted)")
    parser.add_argument("--model", default=None, help="model directory (default: the shipped model)")


def run_inspect(args: argparse.Namespace) -> int:
    if args.npcs < 1 or not args.day > 0 or not args.fps > 0 or args.duration < 0:
        print("error: --npcs, --day and --fps must be positive, --duration >= 0", file=sys.stderr)
        return 2
    from .demo import serve_village

    gen = load_generator(args.model)
    if gen is None:
        return 1
    try:
        asyncio.run(serve_village(gen, host=args.host, port=args.port, npcs=args.npcs, seed=args.seed,
                                  day=args.day, fps=args.fps, duration=args.duration))
    except KeyboardInterrupt:
        pass
    finally:
        gen.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
