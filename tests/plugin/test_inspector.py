"""The web inspector: its JSON endpoints over a running village, and (when Chromium is
installed) the page rendered headless."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from plugin import World
from plugin.inspector import make_app
from plugin.village import PlayerScript, build_village


@pytest.fixture
def village(generator: Any) -> World:
    world = World(generator, seed=3, deterministic=True)
    script = PlayerScript(build_village(world, 4), 30.0)
    t_prev = -1.0
    for frame in range(120):  # 12 s of day: Aria meets the first villagers
        t = frame * 0.1
        list(script.run_beats(world, t_prev, t))
        t_prev = t
        script.move(world, t)
        world.update(0.1)
    assert world.recent_lines
    return world


async def test_json_endpoints_show_the_running_world(village: World) -> None:
    async with TestClient(TestServer(make_app(village))) as client:
        w = await (await client.get("/api/world")).json()
        assert w["context"]["time_of_day"] == "day" and w["players"][0]["name"] == "Aria"
        assert w["stats"]["npcs"] == 4

        npcs = await (await client.get("/api/npcs")).json()
        assert [n["id"] for n in npcs] == ["bram", "mira", "oswin", "hilda"]
        assert all(n["state"] in ("patrol", "working", "idle", "friendly", "alert") for n in npcs)

        detail = await (await client.get("/api/npcs/bram")).json()
        nodes = detail["tree"]["nodes"]
        assert detail["tree"]["main"] == "VillageGuard" and nodes[0]["parent"] is None
        assert {n["status"] for n in nodes} <= {"IDLE", "RUNNING", "SUCCESS", "FAILURE", "SKIPPED"}
        assert detail["blackboard"]["shift"] == "day" and detail["mermaid"].startswith("flowchart")
        village.update(0.5)  # ticks are traced from now on: statuses show what nodes returned
        detail = await (await client.get("/api/npcs/bram")).json()
        assert {n["status"] for n in detail["tree"]["nodes"]} - {"IDLE"}

        lines = await (await client.get("/api/lines?limit=2")).json()
        assert 1 <= len(lines) <= 2 and {"npc_id", "text", "state", "latency_ms", "fallback"} <= set(lines[0])

        metrics = await (await client.get("/api/metrics")).json()
        assert metrics["world"]["lines"] == len(village.recent_lines)
        assert metrics["engine"]["lines"] >= metrics["world"]["lines"]

        assert (await client.get("/api/npcs/nobody")).status == 404
        assert (await client.get("/api/lines?limit=x")).status == 400
        page = await client.get("/")
        assert page.status == 200 and "FlashNPC inspector" in await page.text()
        prom = await client.get("/metrics")
        assert prom.status == 200


def _chromium() -> str | None:
    """A headless-capable Chromium: ``$CHROMIUM``, else Debian's ``chromium`` (what ``.ci/run``
    installs) or another common name on PATH."""
    named = os.environ.get("CHROMIUM")
    if named:
        return shutil.which(named) or named
    for name in ("chromium", "chromium-browser", "chromium-headless-shell", "google-chrome", "headless_shell"):
        path = shutil.which(name)
        if path:
            return path
    return None


# .ci/run sets FLASHNPC_REQUIRE_BROWSER=1: there a missing Chromium fails instead of skipping
needs_chromium = pytest.mark.skipif(
    _chromium() is None and not os.environ.get("FLASHNPC_REQUIRE_BROWSER"),
    reason="headless Chromium is not installed (Debian: apt-get install chromium)")


async def _headless(url: str, *flags: str, width: int = 1280, height: int = 800) -> bytes:
    """Run headless Chromium on ``url`` for 3 s of virtual time; its stdout."""
    binary = _chromium()
    assert binary is not None, "FLASHNPC_REQUIRE_BROWSER is set but no Chromium is installed"
    proc = await asyncio.create_subprocess_exec(
        binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        f"--window-size={width},{height}", "--virtual-time-budget=3000", *flags, url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=90)
    assert proc.returncode == 0
    return out


@needs_chromium
async def test_page_renders_in_headless_chromium(village: World, tmp_path: Path) -> None:
    """The page as a browser shows it: a screenshot (kept in $FLASHNPC_SCREENSHOT_DIR when set,
    for a person to look at), and the rendered DOM holding what the JSON endpoints say."""
    server = TestServer(make_app(village))
    await server.start_server()
    try:
        url = str(server.make_url("/"))
        shots = Path(os.environ.get("FLASHNPC_SCREENSHOT_DIR") or tmp_path)
        shots.mkdir(parents=True, exist_ok=True)
        for width, height in ((1280, 800), (1000, 900)):
            shot = shots / f"inspector-{width}x{height}.png"
            await _headless(url, f"--screenshot={shot}", width=width, height=height)
            assert shot.is_file() and shot.stat().st_size > 10_000
        dom = (await _headless(url, "--dump-dom")).decode()
    finally:
        await server.close()
    assert '<span id="clock">t = ' in dom  # not 'disconnected: ...'
    for npc in village.npcs:
        assert f'data-id="{npc}"' in dom  # the NPC table was filled in by the page's script
    assert "behavior tree of bram (guard, VillageGuard)" in dom
    assert "<dt>latency p50 / p99</dt>" in dom and "<dt>fallback reasons</dt>" in dom
    assert '<span class="chip"><b>time of day</b> day</span>' in dom
    assert "<td>Aria</td>" in dom
    first = village.recent_lines[-1]
    assert f"<b>{first.npc_id}</b>" in dom  # the newest line is listed


async def test_flashnpc_inspect_serves_a_village_that_runs_in_real_time(generator: Any) -> None:
    import aiohttp

    from plugin.demo import start_village

    live = await start_village(generator, npcs=3, day=20.0, fps=60.0)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(live.url + "api/world") as r:
                first = await r.json()
            frame = live.world.frame
            while live.world.frame < frame + 3:  # let the simulation task run a few frames
                await asyncio.sleep(0.01)
            async with session.get(live.url + "api/world") as r:
                later = await r.json()
            async with session.get(live.url + "api/npcs") as r:
                npcs = await r.json()
        assert later["frame"] > first["frame"] and later["time"] > first["time"]
        assert [n["id"] for n in npcs] == ["bram", "mira", "oswin"]
        assert first["players"][0]["name"] == "Aria"
    finally:
        await live.close()
    assert live.task.done()
