"""The server over real WebSockets on loopback: many clients, resume, and every bad input."""

import asyncio
import random
import socket

import msgpack
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from server_sync import Client, ServerConfig, SyncServer
from server_sync.sync.protocol import decode_server
from server_sync.sync.world import sim_world
from server_sync.transport.wire import encode

from ..conftest import SECRET, raw, token, until


async def test_300_clients_hold_exact_replicas_through_moves_drops_and_resumes(server):
    rng = random.Random(0)
    url = f"ws://127.0.0.1:{server.port}"
    clients = [Client(url, token(f"p{k}"), position=(rng.uniform(0, 400), rng.uniform(0, 400)),
                      seed=k, backoff_initial_s=0.02, backoff_max_s=0.1,
                      codec="json" if k % 5 == 0 else "msgpack") for k in range(300)]
    tasks = [asyncio.create_task(c.run()) for c in clients]
    await asyncio.wait_for(asyncio.gather(*(c.synced.wait() for c in clients)), 60)
    for _ in range(5):
        for c in clients:
            x, y = c.position
            await c.send_intent(pos=(min(400, max(0, x + rng.uniform(-10, 10))),
                                     min(400, max(0, y + rng.uniform(-10, 10)))))
        for c in rng.sample(clients, 30):
            await c.drop_connection()
        t0 = server.core.ticks
        await until(lambda t0=t0: server.core.ticks >= t0 + 5, 5, "five ticks")
    await asyncio.wait_for(asyncio.gather(*(c.wait_acked() for c in clients)), 30)
    server.core.frozen = True
    sessions = server.core.sessions
    await until(lambda: all(c.synced.is_set() and c.replica.seq == sessions[f"p{k}"].seq
                            for k, c in enumerate(clients)), 30, "replicas caught up")
    areas = server.core.areas()
    for k, c in enumerate(clients):
        area = areas[f"p{k}"]
        assert (c.replica.seq, c.replica.npcs) == (area["seq"], area["npcs"]), f"p{k}"
        assert list(area["player_pos"]) == list(c.position)
    assert sum(c.gaps for c in clients) == 0
    assert sum(sum(c.refused.values()) for c in clients) == 0  # walking pace
    assert server.core.replays_total > 0
    assert sum(c.connects for c in clients) > 300
    for c in clients:
        await c.close()
    await asyncio.gather(*tasks)


def hello(player="alice", **kw):
    return encode({"t": "hello", "v": 1, "token": token(player, **kw)}, "msgpack")


@pytest.mark.parametrize(("frames", "code"), [
    ([encode({"t": "hello", "v": 1, "token": "forged.token"}, "msgpack")], "auth_failed"),
    ([encode({"t": "hello", "v": 1, "token": token("a", ttl_s=-1)}, "msgpack")], "token_expired"),
    ([encode({"t": "intent", "cseq": 1, "pos": [0, 0]}, "msgpack")], "not_authenticated"),
    ([encode({"t": "hello", "v": 9, "token": token("a")}, "json")], "unsupported_version"),
    ([b"\xc1\xc1"], "bad_frame"),
    ([hello(), msgpack.packb({"t": "intent", "cseq": "one", "pos": [0, 0]})], "bad_message"),
    ([hello(), encode({"t": "launch_missiles"}, "msgpack")], "bad_message"),
])
async def test_bad_input_gets_an_error_naming_the_reason_then_a_close(server, frames, code):
    got, close = await raw(server.port, frames)
    errors = [m for m in got if m["t"] == "error"]
    assert [e["code"] for e in errors] == [code]
    assert close.code == 1008 and close.reason.startswith(code)
    assert server.errors[code] == 1


async def test_a_frame_over_the_size_limit_closes_with_1009(server):
    big = encode({"t": "intent", "cseq": 1, "talk": {"npc": "n", "intent": "x" * 5000}}, "msgpack")
    _, close = await raw(server.port, [hello(), big])
    assert close.code == 1009
    await until(lambda: server.errors["too_big"] == 1, 5, "too_big counted")


async def test_a_client_over_the_message_rate_is_disconnected(server):
    flood = [encode({"t": "intent", "cseq": k, "pos": [0, 0]}, "msgpack") for k in range(1, 80)]
    got, close = await raw(server.port, [hello(), *flood])
    assert close.reason.startswith("rate_limited")
    assert [m["code"] for m in got if m["t"] == "error"] == ["rate_limited"]


async def test_a_client_that_does_not_read_is_dropped_as_slow_not_buffered_forever():
    world = sim_world(400, changes_per_s=1e-6, size=100.0)
    srv = SyncServer(world, ServerConfig(secret=SECRET, port=0, http_port=None, radius=200.0,
                                         max_outbound_bytes=32 * 1024, rate_per_s=1000,
                                         rate_burst=1000))
    await srv.start()
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", srv.port))
        async with connect(f"ws://127.0.0.1:{srv.port}", sock=sock, max_queue=1,
                           compression=None, close_timeout=1) as ws:
            await ws.send(hello("slow"))
            await until(lambda: "slow" in srv.conns, 5, "slow client attached")
            server_sock = srv.conns["slow"].transport.get_extra_info("socket")
            server_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            for _ in range(200):  # each resync answers with a ~14 KB snapshot
                await ws.send(encode({"t": "resync", "seq": 0}, "msgpack"))
            await until(lambda: "slow" not in srv.conns, 20, "slow client dropped")
        assert srv.errors["slow_consumer"] == 1
    finally:
        await srv.stop()


async def test_the_same_player_connecting_again_replaces_the_old_connection(server):
    url = f"ws://127.0.0.1:{server.port}"
    async with connect(url) as first:
        await first.send(hello("bob"))
        assert decode_server(await first.recv())[0]["t"] == "snapshot"
        async with connect(url) as second:
            await second.send(hello("bob"))
            assert decode_server(await second.recv())[0]["t"] == "snapshot"
            msgs = []
            with pytest.raises(ConnectionClosed):
                async for f in first:
                    msgs.append(decode_server(f)[0])
            assert {"t": "error", "code": "replaced", "reason": "player connected again"} in msgs


async def test_health_and_metrics_over_http():
    import aiohttp

    world = sim_world(50, changes_per_s=50, size=100.0)
    srv = SyncServer(world, ServerConfig(secret=SECRET, port=0, http_port=0, admin_token="adm"))
    await srv.start()
    try:
        base = f"http://127.0.0.1:{srv.http_port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/health") as r:
                body = await r.json()
                assert r.status == 200 and body["status"] == "ready"
            async with http.get(f"{base}/metrics") as r:
                text = await r.text()
                assert "flashnpc_sync_clients 0.0" in text and "flashnpc_sync_ticks_total" in text
            async with http.get(f"{base}/admin/areas") as r:
                assert r.status == 401
            async with http.post(f"{base}/admin/freeze",
                                 headers={"Authorization": "Bearer adm"}) as r:
                assert (await r.json()) == {"frozen": True}
    finally:
        await srv.stop()


async def test_the_server_binds_to_loopback_by_default():
    assert ServerConfig(secret=SECRET).host == "127.0.0.1"


async def test_health_turns_degraded_with_the_database_error_when_the_journal_fails(tmp_path):
    from server_sync.sync.persistence import Store

    world = sim_world(20, changes_per_s=100, size=50.0)
    store = Store(tmp_path / "w.sqlite")
    srv = SyncServer(world, ServerConfig(secret=SECRET, port=0, http_port=None), store)
    await srv.start()
    try:
        await until(lambda: srv.core.ticks > 2, 5, "ticks")
        assert srv.health()["status"] == "ready"
        store.db.close()  # the journal can no longer be written (nor read)
        await until(lambda: srv.core.unavailable is not None, 5, "the outage")
        health = srv.health()
        assert health["status"] == "degraded"
        assert any("journal unavailable" in r and "closed database" in r
                   for r in health["reasons"]), health
        assert srv.errors["tick_failed"] == 0
    finally:
        store.close = lambda: None  # already closed
        await srv.stop()
