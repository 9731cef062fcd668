"""What a line costs a game by where it comes from, in one run: the studio's own line for the cell
(``authored``), the same move in a near state chosen by the model's state fit (``authored_near``,
first request and cached), and a line the model writes (playback off), on one fine-tuned model.

    python bench/playback_bench.py runs/studio_relay_station/model [--lines 200] [--rounds 3]

Requests: the file's own tags (``authored.json``), each request on a fresh player so the repeat
memory never steers it. Prints per kind the median and p90 latency (ms) over the rounds' medians,
and each kind's median as a multiple of the generated line's.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from runtime.client.generator import LineGenerator


def _time(gen: LineGenerator, reqs: list[dict], tag: str) -> tuple[list[float], dict[str, int]]:
    times, kinds = [], {}
    for i, r in enumerate(reqs):
        t0 = time.perf_counter()
        line = gen.generate(**r, seed=i, player_id=(tag, i))
        times.append((time.perf_counter() - t0) * 1e3)
        kinds[line.finish_reason] = kinds.get(line.finish_reason, 0) + 1
    return times, kinds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--lines", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    served = LineGenerator.load(args.model)
    alone = LineGenerator.load(args.model, authored=None)
    book = served.authored
    if book is None:
        raise SystemExit(f"{args.model}: no authored.json (not a fine-tune)")
    rng = random.Random(args.seed)
    states = served.catalog()["states"]
    lines = rng.sample(list(book.lines), min(args.lines, len(book.lines)))
    covered = [dict(npc=ln.archetype, state=ln.state, intent=ln.intent, persona=list(ln.persona),
                    context=dict(ln.context)) for ln in lines]
    gaps = []
    for ln in lines:  # the same archetype and move in a state the writers did not cover
        for st in rng.sample(states, len(states)):
            if (ln.archetype, st, ln.intent) not in book.cells and book.near(ln.archetype, st, ln.intent):
                gaps.append(dict(npc=ln.archetype, state=st, intent=ln.intent))
                break
    results: dict[str, list[float]] = {}
    kinds: dict[str, dict[str, int]] = {}
    for k in range(args.rounds):
        fresh = LineGenerator.load(args.model)  # a cold fit cache every round
        for name, gen, reqs in (("authored", served, covered), ("near, first", fresh, gaps),
                                ("near, cached", fresh, gaps), ("generated", alone, covered)):
            t, kd = _time(gen, reqs, f"{name}{k}")
            results.setdefault(name, []).append(statistics.median(t))
            results.setdefault(name + " p90", []).append(sorted(t)[int(0.9 * (len(t) - 1))])
            kinds[name] = kd
        fresh.close()
    base = statistics.median(results["generated"])
    print(f"model {args.model}: {len(covered)} covered requests, {len(gaps)} gap requests, {args.rounds} rounds")
    print(f"{'kind':14s} {'median ms':>10s} {'p90 ms':>8s} {'x generated':>12s}  finish reasons (last round)")
    for name in ("authored", "near, first", "near, cached", "generated"):
        med = statistics.median(results[name])
        p90 = statistics.median(results[name + " p90"])
        print(f"{name:14s} {med:10.2f} {p90:8.2f} {med / base:12.3f}  {kinds[name]}")
    served.close()
    alone.close()


if __name__ == "__main__":
    main()
