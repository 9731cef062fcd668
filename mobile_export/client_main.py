"""The offline demo client: load a model bundle through the runtime and print NPC lines.

This is the entry point ``flashnpc export client`` packages with PyInstaller (the executable
runs it with no Python installed); it also runs as ``python -m mobile_export.client_main``.
It imports the runtime's client side only (onnxruntime, numpy, the engine): never torch,
onnx or the training code.

    flashnpc-client [demo] [--bundle PATH] [--seed N] [--lines N]

Without ``--bundle`` it uses the bundle packaged beside it (``bundle/`` in the build).
Prints ``first line after N ms`` (from process start) and then one line per archetype/state
pair shown; exit status 0 when at least one line was produced.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

_T0 = time.perf_counter()  # as early as this module runs: the cold-start clock

DEMO_STATES = ("idle", "working", "alert", "friendly", "patrol", "combat")


def packaged_bundle() -> Path:
    """The bundle shipped with the executable (PyInstaller's data dir), else beside this file."""
    base = Path(getattr(sys, "_MEIPASS", Path(__file__).resolve().parent))
    return base / "bundle"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flashnpc-client", description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=("demo",), default="demo")
    parser.add_argument("--bundle", type=Path, default=None, help="bundle directory or zip")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--lines", type=int, default=6, help="how many archetype/state pairs to show")
    args = parser.parse_args(argv)

    from runtime.client.generator import LineGenerator, ModelLoadError

    path = args.bundle if args.bundle is not None else packaged_bundle()
    try:
        gen = LineGenerator.load(path, warmup=False)  # verifies the bundle (sizes, hashes, version)
    except ModelLoadError as exc:
        print(f"flashnpc-client: {exc}", file=sys.stderr)
        return 2
    bundle = gen.model.bundle if gen.model is not None else None
    if bundle is None:
        print(f"flashnpc-client: {path} is a model directory, not a bundle", file=sys.stderr)
        gen.close()
        return 2
    catalog = gen.catalog()
    states = [s for s in DEMO_STATES if s in catalog["states"]] or list(catalog["states"])
    pairs = [(arch, states[i % len(states)]) for i, arch in enumerate(catalog["archetypes"])][: args.lines]
    m = bundle.manifest["model"]
    print(f"model {m['id']} {m['version']} ({m['format']}, target {m['target']})", flush=True)
    produced = 0
    for i, (arch, state) in enumerate(pairs):
        line = gen.generate(arch, state, intent="greet" if "greet" in catalog["intents"] else
                            catalog["intents"][0], seed=args.seed + i)
        if i == 0:
            print(f"first line after {(time.perf_counter() - _T0) * 1e3:.0f} ms", flush=True)
        tag = f"fallback: {line.fallback_reason}" if line.fallback else f"{line.latency_ms:.1f} ms"
        print(f"{arch:>12} / {state:<8} {line.text}  ({tag})", flush=True)
        produced += bool(line.text)
    gen.close()
    return 0 if produced else 1


if __name__ == "__main__":
    sys.exit(main())
