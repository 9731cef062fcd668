"""The `flashnpc` command line, and plugin's own commands (``demo``, ``inspect``).

Each subcommand lives with the package that owns it, in the package's ``cli.py``: for a
command NAME, the module exposes ``add_NAME_arguments(parser)`` and ``run_NAME(args) -> int``
(behavior_tree's ``cli.py``, one command, exposes ``add_arguments`` and ``run``). This file
dispatches, importing the owning module lazily so ``flashnpc bt ...`` never imports torch or
onnxruntime.

Errors are one line and a non-zero exit, never a traceback: :func:`main` catches OSError and
the error types a command's module names in ``EXPECTED_ERRORS`` (``"module:Class"`` strings,
resolved only when that module is loaded, so nothing is imported for them) and prints
``flashnpc COMMAND: error: ...``, exit 1 (2 for a bad argument, 130 when interrupted). Set
``FLASHNPC_TRACEBACK=1`` to see the traceback instead.

``flashnpc demo``: the main job, a headless day and night in the example village
(:func:`plugin.demo.run_village`); ``--json`` prints its figures as JSON. ``flashnpc inspect``:
the village live, with the web inspector (:func:`plugin.demo.serve_village`), on port
:data:`INSPECT_PORT` (``flashnpc serve`` keeps 8765-8768).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import io
import json
import os
import sys
from typing import Any

# `flashnpc inspect`'s default port: `flashnpc serve` uses 8765 (WebSocket), 8766 (HTTP) and,
# with --dialogue, 8767 / 8768, so both can run side by side
INSPECT_PORT = 8770

# errors of the commands run here, reported as one line (see the module docstring)
EXPECTED_ERRORS = ("runtime.client.errors:ModelLoadError",)

# subcommand -> (module, function prefix: add_<prefix>_arguments / run_<prefix>, or "" for
# add_arguments / run; one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "demo": ("plugin.cli", "demo", "run the headless NPC demo (the main job)"),
    "bt": ("behavior_tree.cli", "", "behavior trees: validate, render, demo"),
    "train": ("runtime.cli", "train", "train the Flash line model"),
    "eval": ("runtime.cli", "eval", "evaluate a Flash model"),
    "finetune": ("runtime.cli", "finetune", "fine-tune a Flash model on a studio's own lines"),
    "linebook": ("runtime.cli", "linebook", "the line book: check one (lint), its JSON Schema for editors"),
    "export": ("mobile_export.cli", "export",
               "export a model: onnx (checkpoint -> INT4 model), mobile (bundle), client (packaged "
               "demo), genai (onnxruntime-genai folder)"),
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
        command = sub.add_parser(name, help=help_text, description=help_text)
        # _parser: the parser that reports a flag it does not know; a subcommand's own
        # subparsers may set theirs (their defaults win)
        command.set_defaults(_parser=command)
        add(command)
        command.set_defaults(_run=getattr(module, f"run_{prefix}" if prefix else "run"), _module=module_name)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``flashnpc`` with ``argv`` (default: the process's); returns the exit status."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the (sub)command that refuses them, with its usage; exits 2
        getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print(f"{args._parser.prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if os.environ.get("FLASHNPC_TRACEBACK") or not isinstance(exc, expected_errors(args._module)):
            raise
        print(f"{args._parser.prog}: error: {one_line(exc)}", file=sys.stderr)
        return 1


def expected_errors(module_name: str) -> tuple[type[BaseException], ...]:
    """OSError and the classes ``module_name`` lists in ``EXPECTED_ERRORS`` whose modules are
    loaded (an exception of a class from a module never imported cannot have been raised)."""
    module = sys.modules.get(module_name)
    names = getattr(module, "EXPECTED_ERRORS", ())
    found: list[type[BaseException]] = [OSError]
    for name in names:
        mod, _, cls = name.partition(":")
        value = getattr(sys.modules.get(mod), cls, None)
        if isinstance(value, type) and issubclass(value, BaseException):
            found.append(value)
    return tuple(found)


def one_line(exc: BaseException) -> str:
    """The error as one line: an OSError's file and reason, else its message with lines joined."""
    if isinstance(exc, OSError) and exc.strerror:  # OSError(errno, strerror[, filename])
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror}"
    text = " ".join(part.strip() for part in str(exc).splitlines() if part.strip())
    return text or type(exc).__name__


# --------------------------------------------------------------------------- flashnpc demo

def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0, help="seed of the tree phases and line sampling")
    parser.add_argument("--npcs", type=int, default=10, help="villagers along the street (default 10)")
    parser.add_argument("--duration", type=float, default=120.0,
                        help="game seconds the walk takes: half by day, half by night (default 120)")
    parser.add_argument("--fps", type=float, default=10.0, help="simulated frames per game second")
    parser.add_argument("--model", default=None, help="model directory (default: the shipped model)")
    parser.add_argument("--states", action="store_true", help="also print every state change")
    parser.add_argument("--json", action="store_true",
                        help="print the figures and the lines as one JSON object instead of the transcript")


def run_demo(args: argparse.Namespace) -> int:
    if args.npcs < 1:
        print("flashnpc demo: error: --npcs must be at least 1", file=sys.stderr)
        return 2
    if not args.duration > 0 or not args.fps > 0:
        print("flashnpc demo: error: --duration and --fps must be positive", file=sys.stderr)
        return 2
    from .demo import run_village

    gen = load_generator(args.model, "flashnpc demo")
    if gen is None:
        return 1
    try:
        result = run_village(gen, seed=args.seed, npcs=args.npcs, duration=args.duration, fps=args.fps,
                             show_states=args.states, out=io.StringIO() if args.json else None)
    finally:
        gen.close()
    if args.json:
        result.pop("world")
        result["transcript"] = [dataclasses.asdict(ev) for ev in result["transcript"]]
        print(json.dumps(result, indent=2, default=str))
    return 0


def load_generator(model: str | None, command: str = "flashnpc") -> Any:
    """The line engine for ``--model`` (None: the shipped model), or None after printing why
    it could not load (as ``command``'s error)."""
    from runtime import LineGenerator, ModelLoadError

    try:
        return LineGenerator.load(model)
    except ModelLoadError as exc:
        print(f"{command}: error: cannot load the model: {exc}", file=sys.stderr)
        return None


# --------------------------------------------------------------------------- flashnpc inspect

def add_inspect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=INSPECT_PORT,
                        help=f"HTTP port of the inspector (default {INSPECT_PORT}; flashnpc serve uses 8765-8768)")
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
        print("flashnpc inspect: error: --npcs, --day and --fps must be positive, --duration >= 0",
              file=sys.stderr)
        return 2
    from .demo import serve_village

    gen = load_generator(args.model, "flashnpc inspect")
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
