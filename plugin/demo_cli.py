"""`flashnpc demo`: the main job — a headless day and night in the example village.

A scripted traveller walks the street by day and back by night (a bandit follows her at
night); the villagers' behavior trees react (guards turn alert, merchants close, children
run), and every line an NPC speaks is printed with the NPC, its state, the player's intent
and the engine latency. The run ends with a summary table. The world runs in deterministic
mode (seeded, fixed tick order, lines generated in order), so a seed gives the same
transcript every time; latencies are real.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0, help="seed of the tree phases and line sampling")
    parser.add_argument("--npcs", type=int, default=10, help="villagers along the street (default 10)")
    parser.add_argument("--duration", type=float, default=120.0,
                        help="game seconds the walk takes: half by day, half by night (default 120)")
    parser.add_argument("--fps", type=float, default=10.0, help="simulated frames per game second")
    parser.add_argument("--model", default=None, help="model directory (default: the shipped model)")
    parser.add_argument("--states", action="store_true", help="also print every state change")


def run(args: argparse.Namespace) -> int:
    if args.npcs < 1:
        print("error: --npcs must be at least 1", file=sys.stderr)
        return 2
    if not args.duration > 0 or not args.fps > 0:
        print("error: --duration and --fps must be positive", file=sys.stderr)
        return 2
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
    from runtime.generator import LineGenerator, ModelLoadError

    try:
        return LineGenerator.load(model)
    except ModelLoadError as exc:
        print(f"error: cannot load the model: {exc}", file=sys.stderr)
        return None


def run_village(generator: Any, *, seed: int = 0, npcs: int = 10, duration: float = 120.0,
                fps: float = 10.0, show_states: bool = False, out: TextIO | None = None) -> dict[str, Any]:
    """Run the scripted village and print the transcript and summary to ``out`` (stdout);
    returns ``world.stats()`` plus ``wall_s``, ``transcript`` (the Line events), ``world`` and
    ``generator`` (the engine's stats)."""
    from .events import Line, LineDropped, StateChanged
    from .village import PlayerScript, build_village
    from .world import World

    out = out or sys.stdout
    world = World(generator, seed=seed, deterministic=True)
    people = build_village(world, npcs)
    names = {r.npc_id: r.name for r in people}
    script = PlayerScript(people, duration)
    player_names = {"aria": "Aria", "bandit": "a bandit"}
    print(f"FlashNPC village demo: {len(people)} NPCs, {duration:g} game seconds "
          f"(day, then night), seed {seed}", file=out)
    transcript: list[Line] = []
    dt = 1.0 / fps
    t_prev = -1.0
    frames = round(duration * fps)
    wall0 = time.perf_counter()
    for frame in range(frames + 1):
        t = frame * dt
        for beat in script.run_beats(world, t_prev, t):
            if beat.kind == "context":
                print(f"[{t:6.1f}s] -- {', '.join(f'{k} is now {v}' for k, v in beat.args)}", file=out)
            elif beat.kind == "player":
                print(f"[{t:6.1f}s] -- {beat.args[1]} enters the village ({beat.args[3]})", file=out)
            elif beat.kind == "leave":
                print(f"[{t:6.1f}s] -- {player_names.get(beat.args[0], beat.args[0])} leaves", file=out)
        t_prev = t
        script.move(world, t)
        for ev in world.update(0.0 if frame == 0 else dt):
            if isinstance(ev, Line):
                transcript.append(ev)
                who = names.get(ev.npc_id, ev.npc_id)
                to = player_names.get(ev.player_id, ev.player_id)
                tag = f" fallback:{ev.fallback_reason}" if ev.fallback else ""
                print(f"[{ev.time:6.1f}s] {who} ({ev.archetype}, {ev.state}) -> {to} [{ev.intent}] "
                      f"{ev.text!r}  {ev.latency_ms:.0f} ms{tag}", file=out)
            elif isinstance(ev, StateChanged) and ev.key == "state" and show_states:
                print(f"[{ev.time:6.1f}s]   {names.get(ev.npc_id, ev.npc_id)}: {ev.old} -> {ev.new}",
                      file=out)
            elif isinstance(ev, LineDropped) and show_states:
                print(f"[{ev.time:6.1f}s]   line {ev.request_id} dropped ({ev.reason})", file=out)
    wall = time.perf_counter() - wall0
    stats = world.stats()
    gstats = generator.stats()
    _summary(stats, gstats, wall, out)
    world.close()
    return {**stats, "wall_s": wall, "transcript": transcript, "generator": gstats, "world": world}


def _fmt(v: float | None, unit: str = "") -> str:
    return "-" if v is None else f"{v:.1f}{unit}"


def _summary(stats: dict[str, Any], gstats: dict[str, Any], wall: float, out: TextIO) -> None:
    lines = stats["lines"]
    rows = [
        ("lines spoken", str(lines)),
        ("model lines", str(lines - stats["fallbacks"])),
        ("fallback lines", f"{stats['fallbacks']}"
         + (f"  {gstats.get('fallback_reasons')}" if stats["fallbacks"] else "")),
        ("latency p50", _fmt(stats["latency_ms_p50"], " ms")),
        ("latency p99", _fmt(stats["latency_ms_p99"], " ms")),
        ("prefix-cache hit rate (lines)", "-" if stats["prefix_cache_hit_rate"] is None
         else f"{100 * stats['prefix_cache_hit_rate']:.0f}%"),
        ("prefix-cache hit rate (tokens)", "-" if gstats["prefix_cache"]["hit_rate"] is None
         else f"{100 * gstats['prefix_cache']['hit_rate']:.0f}%"),
        ("state changes", str(stats["state_changes"])),
        ("stale lines dropped / regenerated", f"{stats['dropped_stale']} / {stats['regenerated']}"),
        ("tree ticks", str(stats["tree_ticks"])),
        ("wall time", f"{wall:.1f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    print("\nsummary", file=out)
    print(f"  {'-' * width}  {'-' * 12}", file=out)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}", file=out)
