"""World frame cost: 1,000 village NPCs and 10 moving players at 60 frames per second.

Measures ``World.update(dt)`` per frame with the engine in fallback-only mode (a real
``LineGenerator`` with no model: lines are requested, queued and delivered, but cost no model
time), and then the proximity step alone, side by side: the world's spatial hash grid against
all-pairs distance checks (plain Python, and numpy-vectorised) on the same positions.

    python3 bench/world_bench.py                  # 1000 NPCs, 10 players, 1200 frames
    python3 bench/world_bench.py --npcs 5000 --frames 600

Prints absolute figures and ratios; no pass/fail (the goal: median update <= 2 ms).
"""

from __future__ import annotations

import argparse
import gc
import math
import platform
import random
import statistics
import sys
import time

import numpy as np

from plugin import Line, World
from plugin.village import residents, village_tree
from runtime.client.generator import LineGenerator


def build(n_npcs: int, n_players: int, side: float, seed: int,
          model: bool = False) -> tuple[World, list[list[float]]]:
    if model:
        gen = LineGenerator.load()  # the shipped model, decoding in the engine's worker thread
    else:
        gen = LineGenerator.fallback_only()  # catalog, constraints and fallbacks; no model time
    world = World(gen, seed=seed, max_in_flight=16)
    rng = random.Random(seed)
    for r in residents(n_npcs):
        world.add_npc(r.npc_id, r.archetype, village_tree(r.tree), persona=r.persona,
                      position=(rng.uniform(0, side), rng.uniform(0, side)), context=dict(r.blackboard))
    walkers = []
    for i in range(n_players):
        x, y = rng.uniform(0, side), rng.uniform(0, side)
        world.add_player(f"p{i}", f"Player {i}", (x, y), reputation="hostile" if i == 0 else "friendly")
        walkers.append([x, y, rng.uniform(0, 2 * math.pi)])
    return world, walkers


def walk(world: World, walkers: list[list[float]], rng: random.Random, dt: float, side: float) -> None:
    speed = 4.0  # m/s: a jogging player
    for i, w in enumerate(walkers):
        w[2] += rng.uniform(-0.3, 0.3)
        w[0] = min(side, max(0.0, w[0] + math.cos(w[2]) * speed * dt))
        w[1] = min(side, max(0.0, w[1] + math.sin(w[2]) * speed * dt))
        world.move_player(f"p{i}", (w[0], w[1]))


def all_pairs_python(npc_pos: list[tuple[float, float]], radii: list[float],
                     players: list[tuple[float, float]]) -> int:
    hits = 0
    for px, py in players:
        for (nx, ny), r in zip(npc_pos, radii):
            dx, dy = nx - px, ny - py
            if dx * dx + dy * dy <= r * r:
                hits += 1
    return hits


def all_pairs_numpy(npc_xy: np.ndarray, r2: np.ndarray, players: np.ndarray) -> int:
    d = npc_xy[None, :, :] - players[:, None, :]
    return int(((d * d).sum(-1) <= r2[None, :]).sum())


def grid_hits(world: World, players: list[tuple[float, float]]) -> int:
    hits = 0
    grid, npcs, rmax = world.grid, world.npcs, world._max_radius
    for px, py in players:
        for nid in grid.candidates(px, py, rmax):
            npc = npcs[nid]
            nx, ny = npc.position
            dx, dy = nx - px, ny - py
            if dx * dx + dy * dy <= npc.radius * npc.radius:
                hits += 1
    return hits


def time_it(fn, reps: int) -> float:  # type: ignore[no-untyped-def]
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--npcs", type=int, default=1000)
    ap.add_argument("--players", type=int, default=10)
    ap.add_argument("--frames", type=int, default=1200)
    ap.add_argument("--side", type=float, default=300.0, help="side of the square world, metres")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", action="store_true",
                    help="use the shipped model instead of the fallback-only engine, frames paced at "
                         "60 fps of wall time: lines decode in the engine's worker thread between and "
                         "during frames (what a frame pays for sharing the interpreter with it)")
    ap.add_argument("--no-freeze", action="store_true",
                    help="skip gc.freeze() after loading (full collections of the loaded heap then "
                         "cost 100-300 ms frames every few seconds)")
    args = ap.parse_args()
    dt = 1.0 / 60
    t0 = time.perf_counter()
    world, walkers = build(args.npcs, args.players, args.side, args.seed, args.model)
    build_s = time.perf_counter() - t0
    rng = random.Random(args.seed + 1)
    samples: list[float] = []
    lines = 0
    gc.collect()
    if not args.no_freeze:
        gc.freeze()  # what a game does after loading: the loaded heap leaves the collector's scans
    next_frame = time.perf_counter()
    for frame in range(args.frames):
        if args.model:  # real time: the engine decodes between frames, as in a game
            next_frame += dt
            pause = next_frame - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        if frame == args.frames // 2:
            world.set_context(time_of_day="night")  # every NPC's routine changes at once
        walk(world, walkers, rng, dt, args.side)
        t = time.perf_counter()
        events = world.update(dt)
        samples.append((time.perf_counter() - t) * 1e3)
        lines += sum(1 for e in events if isinstance(e, Line))
    world.drain()
    stats = world.stats()
    worst = sorted(range(len(samples)), key=samples.__getitem__)[-3:][::-1]
    samples_by_frame = list(samples)
    samples.sort()

    def pct(q: float) -> float:
        return samples[min(len(samples) - 1, math.ceil(q / 100 * len(samples)) - 1)]

    print(f"machine: {platform.machine()} {platform.processor() or ''} python {platform.python_version()}, "
          f"{args.npcs} NPCs, {args.players} players, {args.frames} frames at 60 fps, world {args.side:g} m square, "
          f"gc.freeze {'off' if args.no_freeze else 'on'}")
    print(f"build: {build_s * 1e3:.0f} ms")
    engine = "shipped model in a worker thread" if args.model else "model excluded: fallback-only engine"
    print(f"World.update per frame ({engine}): median {statistics.median(samples):.3f} ms, "
          f"p90 {pct(90):.3f} ms, p99 {pct(99):.3f} ms, max {samples[-1]:.3f} ms")
    print("  worst frames: " + ", ".join(f"#{i} {samples_by_frame[i]:.1f} ms" for i in worst)
          + f" (night falls at #{args.frames // 2})")
    print(f"  tree ticks {stats['tree_ticks']} ({stats['tree_ticks'] / args.frames:.1f} per frame), "
          f"lines {lines}, line requests {stats['requests']}, state changes {stats['state_changes']}")
    # proximity alone, same positions
    players = [tuple(w[:2]) for w in walkers]
    npc_pos = [npc.position for npc in world.npcs.values()]
    radii = [npc.radius for npc in world.npcs.values()]
    npc_xy = np.asarray(npc_pos)
    r2 = np.asarray(radii) ** 2
    pl = np.asarray(players)
    assert grid_hits(world, players) == all_pairs_python(npc_pos, radii, players) == all_pairs_numpy(npc_xy, r2, pl)
    t_grid = time_it(lambda: grid_hits(world, players), 200)
    t_py = time_it(lambda: all_pairs_python(npc_pos, radii, players), 20)
    t_np = time_it(lambda: all_pairs_numpy(npc_xy, r2, pl), 200)
    print(f"proximity per frame ({args.players} players x {args.npcs} NPCs): spatial grid {t_grid * 1e6:.1f} us, "
          f"all-pairs Python {t_py * 1e6:.1f} us ({t_py / t_grid:.0f}x the grid), "
          f"all-pairs numpy {t_np * 1e6:.1f} us ({t_np / t_grid:.1f}x the grid)")
    world.generator.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
