"""Bundles beside the model directory they came from: load time and per-token latency.

    python -m mobile_export.bundle_bench MODEL_DIR BUNDLE [BUNDLE ...] [--reps 7]

For the model directory's ``model.int4.onnx`` (the peer: ORT_ENABLE_ALL at load) and each
bundle (directory or zip; ORT format, optimisations fixed at export): median over ``--reps``
of the time to open it with :meth:`FlashOnnx.load` (a bundle's includes checking its manifest
and hashing every file; the hash memo is cleared each time) and the median wall time of one
decoded token after a 12-token prompt, one intra-op thread. Prints absolute figures and the
ratio to the model directory.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np


def measure(path: Path, reps: int, steps: int = 32) -> tuple[float, float]:
    """(median load ms, median ms per decoded token) for a model directory or bundle."""
    import runtime.client.bundle
    from runtime.client.onnx_model import FlashOnnx

    loads = []
    for _ in range(reps):
        runtime.client.bundle._VERIFIED.clear()
        t0 = time.perf_counter()
        model = FlashOnnx.load(path)
        loads.append((time.perf_counter() - t0) * 1e3)
    prompt = np.arange(4, 16, dtype=np.int64)[None, :] % model.config["vocab_size"]
    per_token = []
    for _ in range(reps):
        _, past, _ = model.step(prompt, None)
        nxt = np.asarray([[5]], dtype=np.int64)
        t0 = time.perf_counter()
        for _ in range(steps):
            _, past, _ = model.step(nxt, past)
        per_token.append((time.perf_counter() - t0) * 1e3 / steps)
    return statistics.median(loads), statistics.median(per_token)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("bundles", type=Path, nargs="+")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args(argv)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    base_load, base_tok = measure(args.model_dir, args.reps)
    print(f"{'what':<40} {'load ms':>8} {'x dir':>6} {'ms/token':>9} {'x dir':>6}")
    print(f"{args.model_dir / 'model.int4.onnx'!s:<40} {base_load:8.1f} {1.0:6.2f} {base_tok:9.3f} {1.0:6.2f}")
    for bundle in args.bundles:
        load, tok = measure(bundle, args.reps)
        print(f"{bundle!s:<40} {load:8.1f} {load / base_load:6.2f} {tok:9.3f} {tok / base_tok:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
