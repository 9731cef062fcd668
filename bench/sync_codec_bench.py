"""JSON vs msgpack for the sync protocol's frames: bytes per frame and encode+decode time.

    python bench/sync_codec_bench.py [--repeat 20000]

Frames are the ones a load-test client actually gets (built by a real SyncCore over the
sim world): typical deltas, a snapshot of a full area, an ack, and a client intent. Prints
absolute figures per codec and the msgpack/JSON ratios.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time

from server_sync.sync.core import SyncCore
from server_sync.sync.world import sim_world
from server_sync.transport.wire import decode, encode


def sample_messages(seed: int = 0) -> dict[str, list[dict]]:
    rng = random.Random(seed)
    world = sim_world(2000, changes_per_s=1000, size=4000.0, seed=seed)
    core = SyncCore(world, radius=100.0)
    sessions = []
    for k in range(200):
        s = core.hello(f"p{k}", {"t": "hello", "v": 1, "token": "t",
                                 "pos": [rng.uniform(0, 4000), rng.uniform(0, 4000)]}, "json")
        sessions.append(s)
    snaps = [json.loads(s.outbox[0]) for s in sessions]
    for s in sessions:
        s.outbox.clear()
    deltas = []
    for t in range(200):
        for s in core.tick(0.05, t * 0.05):
            deltas += [json.loads(f) for f in s.outbox]
            s.outbox.clear()
    intents = [{"t": "intent", "cseq": k + 1, "pos": [rng.uniform(0, 4000), rng.uniform(0, 4000)]}
               for k in range(200)]
    return {"delta": [d for d in deltas if d["t"] == "delta"], "snapshot": snaps,
            "ack": [{"t": "ack", "cseq": 12345}], "intent": intents}


def measure(msgs: list[dict], codec: str, repeat: int) -> tuple[float, float]:
    frames = [encode(m, codec) for m in msgs]
    size = statistics.fmean(len(f) if isinstance(f, bytes) else len(f.encode()) for f in frames)
    n = max(1, repeat // len(msgs))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            for m in msgs:
                decode(encode(m, codec))
        best = min(best, (time.perf_counter() - t0) / (n * len(msgs)))
    return size, best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20000)
    args = ap.parse_args()
    print(f"machine: {platform.machine()} {platform.processor() or ''} python "
          f"{platform.python_version()}")
    samples = sample_messages()
    print(f"{'frame':9} {'n':>5} {'json B':>8} {'msgpack B':>10} {'size ratio':>10} "
          f"{'json us':>8} {'msgpack us':>10} {'time ratio':>10}")
    for kind, msgs in samples.items():
        js, jt = measure(msgs, "json", args.repeat)
        ms, mt = measure(msgs, "msgpack", args.repeat)
        print(f"{kind:9} {len(msgs):5d} {js:8.1f} {ms:10.1f} {ms / js:10.2f} {jt:8.2f} {mt:10.2f} "
              f"{mt / jt:10.2f}")


if __name__ == "__main__":
    main()
