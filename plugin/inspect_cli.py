"""`flashnpc inspect`: run the example village live and serve the web inspector.

The village of ``flashnpc demo`` runs in real time (the traveller walks by day and night,
over and over) on the same event loop as an aiohttp server; open the printed address to
watch the NPCs' states, their behavior trees, the lines and the engine metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
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


def run(args: argparse.Namespace) -> int:
    if args.npcs < 1 or not args.day > 0 or not args.fps > 0 or args.duration < 0:
        print("error: --npcs, --day and --fps must be positive, --duration >= 0", file=sys.stderr)
        return 2
    from .demo_cli import load_generator

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
