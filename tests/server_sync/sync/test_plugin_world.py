"""plugin.World on both sides: served (trees only) and mirrored in client mode."""

import asyncio

import pytest

from plugin.events import StateChanged
from plugin.village import build_village
from plugin.world import World
from runtime.client.generator import LineGenerator, ModelLoadError
from server_sync import Client, ServerConfig, SyncServer
from server_sync.sync.plugin_client import WorldMirror
from server_sync.sync.plugin_world import village_world

from ..conftest import SECRET, token, until


def test_a_served_village_syncs_tree_state_without_generating_lines():
    served = village_world("examples/village", 4)
    seen = []
    served.observe(lambda *change: seen.append(change), lambda *move: None)
    served.set_player("p1", served.npc_position("bram"))  # right next to an NPC
    for _ in range(50):
        served.step(0.1)
    assert seen and all(isinstance(v, (str, int, float, bool, type(None))) for *_, v in seen)
    assert served.npc_state("bram")["state"] == served.world.npcs["bram"].blackboard.get("state")
    assert served.world.generator.model is None  # fallback-only: no model on the server
    assert served.world.stats()["requests"] == 0  # barks off: nobody asked for a line
    saved = served.save()
    other = village_world("examples/village", 4)
    other.load(saved)
    assert other.npc_state("bram") == served.npc_state("bram")


def test_a_fallback_only_generator_knows_the_shipped_catalog_and_loads_no_model():
    gen = LineGenerator.fallback_only()
    shipped = LineGenerator.load(warmup=False)
    try:
        assert gen.model is None
        assert gen.catalog() == shipped.catalog()
        line = gen.generate("guard", "alert", intent="greet", seed=3)
        assert line.fallback and line.fallback_reason == "model_unavailable" and line.text
    finally:
        shipped.close()
        gen.close()


def test_a_fallback_only_generator_names_a_missing_model_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="no-such-dir"):
        LineGenerator.fallback_only(tmp_path / "no-such-dir")


async def test_a_client_mode_world_mirrors_server_state_into_its_own_npcs():
    server = SyncServer(village_world("examples/village", 4),
                        ServerConfig(secret=SECRET, port=0, http_port=None, radius=50.0))
    await server.start()
    local = World(LineGenerator.fallback_only(), seed=0)
    build_village(local, 4)
    client = Client(f"ws://127.0.0.1:{server.port}", token("p1"), position=(8.0, 0.0))
    mirror = WorldMirror(client, local)
    task = asyncio.create_task(client.run())
    try:
        await asyncio.wait_for(client.synced.wait(), 10)
        assert all(npc.remote for npc in local.npcs.values())  # the server's trees tick, not these
        server.core.world.apply_state("bram", "state", "alert")
        bb = local.npcs["bram"].blackboard
        await until(lambda: bb.get("state") == "alert", 5, "mirrored state")
        events = local.update(0.1)
        assert any(isinstance(e, StateChanged) and e.npc_id == "bram" and e.key == "state"
                   and e.new == "alert" and e.remote for e in events)
        for _ in range(20):
            local.update(0.1)
        assert [npc.tree.tick_count for npc in local.npcs.values()] == [0] * 4
        assert mirror.unknown_npcs == set() and mirror.rejected == 0
    finally:
        await client.close()
        await task
        await server.stop()


async def test_the_http_port_serves_the_plugin_inspector_next_to_health_to_the_admin_only():
    import aiohttp

    server = SyncServer(village_world("examples/village", 3),
                        ServerConfig(secret=SECRET, port=0, http_port=0, admin_token="adm"))
    await server.start()
    try:
        base = f"http://127.0.0.1:{server.http_port}"
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            for path in ("/api/npcs", "/api/world", "/"):
                async with http.get(f"{base}{path}") as r:
                    assert r.status == 401, path  # every player's position: admin only
            async with http.get(f"{base}/api/npcs", headers={"Authorization": "Bearer adm"}) as r:
                assert r.status == 200
                assert {n["id"] for n in await r.json()} == {"bram", "mira", "oswin"}
            async with http.get(f"{base}/?token=wrong") as r:
                assert r.status == 401
            async with http.get(f"{base}/?token=adm") as r:  # a browser: the cookie, then the page
                assert r.status == 200 and "inspector" in (await r.text()).lower()
            async with http.get(f"{base}/api/npcs") as r:
                assert r.status == 200  # the page's own requests carry the cookie
            async with http.get(f"{base}/metrics") as r:
                assert "flashnpc_sync_clients" in await r.text()
    finally:
        await server.stop()


async def test_without_an_admin_token_the_inspector_is_forbidden():
    import aiohttp

    server = SyncServer(village_world("examples/village", 3),
                        ServerConfig(secret=SECRET, port=0, http_port=0))
    await server.start()
    try:
        async with aiohttp.ClientSession() as http, \
                http.get(f"http://127.0.0.1:{server.http_port}/api/npcs") as r:
            assert r.status == 403
    finally:
        await server.stop()


def test_the_mirror_skips_the_worlds_own_keys_and_counts_refused_values():
    from server_sync.sync.replica import Change

    local = World(LineGenerator.fallback_only(), seed=0, mode="client")
    build_village(local, 2)
    mirror = WorldMirror(Client("ws://127.0.0.1:9", token("p1")), local)
    mirror.apply(Change("set", "bram", "player_near", False, True))  # the client's own input
    mirror.apply(Change("set", "bram", "mood", None, "grim"))
    mirror.apply(Change("set", "bram", "mood", "grim", 7))  # the key holds str: refused, logged
    mirror.apply(Change("set", "ghost", "state", None, "idle"))
    bb = local.npcs["bram"].blackboard
    assert bb.get("player_near") is False and bb.get("mood") == "grim"
    assert (mirror.skipped_keys, mirror.rejected, mirror.unknown_npcs) == ({"player_near"}, 1, {"ghost"})
    assert [(e.key, e.new) for e in local.update(0.1) if isinstance(e, StateChanged)] == [("mood", "grim")]
