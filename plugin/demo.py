"""The example village as a demo: headless (``flashnpc demo``) and live with the web inspector
(``flashnpc inspect``).

:func:`run_village` - the main job: a headless day and night in the example village.
A scripted traveller walks the street by day and back by night (a bandit follows her at
night); the villagers' behavior trees react (guards turn alert, merchants close, children
run), and every line an NPC speaks is printed with the NPC, its state, the player's intent
and the engine latency. The run ends with a summary table. The world runs in deterministic
mode (seeded, fixed tick order, lines generated in order), so a seed gives the same
transcript every time; latencies are real.

:func:`start_village` / :func:`serve_village` - the same village in real time (the traveller
walks by day and night, over and over) on the same event loop as an aiohttp server with
:mod:`plugin.inspector`; open the printed address to watch the NPCs' states, their behavior
trees, the lines and the engine metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Any, TextIO

__all__ = ["LiveVillage", "run_village", "serve_village", "simulate", "start_village"]


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


async def simulate(world: Any, script: Any, fps: float, stop: asyncio.Event) -> None:
    """Update ``world`` in real time at ``fps``, replaying ``script`` (a PlayerScript) in a loop."""
    dt = 1.0 / fps
    t_prev = -1.0
    start = time.monotonic()
    offset = 0.0
    while not stop.is_set():
        t = time.monotonic() - start - offset
        if t > script.duration:  # next day: the walk starts over
            offset += script.duration
            t_prev, t = -1.0, 0.0
            for pid in list(world.players):
                world.remove_player(pid)
        list(script.run_beats(world, t_prev, t))
        t_prev = t
        script.move(world, t)
        world.update(dt)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=dt)


class LiveVillage:
    """The village world updating in real time plus the inspector's HTTP site, on the running
    event loop. ``url`` is where it listens (``port=0`` picks a free port)."""

    def __init__(self, world: Any, runner: Any, task: asyncio.Task[None], stop: asyncio.Event,
                 url: str) -> None:
        self.world, self.runner, self.task, self.stop_event, self.url = world, runner, task, stop, url

    async def close(self) -> None:
        self.stop_event.set()
        await self.task
        self.world.close()
        await self.runner.cleanup()


async def start_village(gen: Any, *, host: str = "127.0.0.1", port: int = 0, npcs: int = 10,
                        seed: int = 0, day: float = 120.0, fps: float = 30.0) -> LiveVillage:
    from aiohttp import web

    from .inspector import make_app
    from .village import PlayerScript, build_village
    from .world import World

    world = World(gen, seed=seed)
    script = PlayerScript(build_village(world, npcs), day)
    runner = web.AppRunner(make_app(world))
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound_host, bound_port = runner.addresses[0][:2]
    stop = asyncio.Event()
    task = asyncio.create_task(simulate(world, script, fps, stop))
    return LiveVillage(world, runner, task, stop, f"http://{bound_host}:{bound_port}/")


async def serve_village(gen: Any, *, host: str, port: int, npcs: int, seed: int, day: float,
                        fps: float, duration: float) -> None:
    live = await start_village(gen, host=host, port=port, npcs=npcs, seed=seed, day=day, fps=fps)
    print(f"FlashNPC inspector: {live.url}  ({npcs} NPCs; Ctrl-C to stop)", flush=True)
    try:
        if duration > 0:
            await asyncio.sleep(duration)
        else:
            await asyncio.Event().wait()
    finally:
        await live.close()
