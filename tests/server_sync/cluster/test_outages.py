"""A node that loses Redis fails closed exactly as for a journal outage (refuses clients,
acknowledges nothing unsaved, probes) and serves again once Redis is back; hostile input to a
cluster node is refused as on one node."""

from __future__ import annotations

import asyncio
import math

from server_sync import Client
from server_sync.sync.protocol import SYNC, decode_server

from ..conftest import token, until
from ..fuzz_harness import run_attacks, serve
from ..fuzz_harness import token as fuzz_token
from ..sync.test_sync_fuzz import generate
from .conftest import cluster_node


def nearest_npc(world, pos):
    return min(world.npc_ids(), key=lambda n: math.dist(world.npc_position(n), pos))


async def test_a_node_without_redis_fails_closed_and_serves_again_when_redis_is_back(
        redis_server):
    async with cluster_node(redis_server.url, "a") as a:
        await until(lambda: len(a.cluster.owned) == len(a.cluster.areas), 20, "all areas owned")
        npc = nearest_npc(a.core.world, (250.0, 250.0))
        x, y = a.core.world.npc_position(npc)
        client = Client(f"ws://127.0.0.1:{a.port}", lambda: token("alice"), position=(x, y),
                        backoff_initial_s=0.05, backoff_max_s=0.2, seed=1)
        task = asyncio.create_task(client.run())
        await asyncio.wait_for(client.synced.wait(), 10)
        await client.send_intent(pos=(x + 1.0, y))
        await asyncio.wait_for(client.wait_acked(), 10)
        redis_server.stop()  # kill -9: the next tick cannot be written
        await client.send_intent(talk=(npc, "threaten"))
        await until(lambda: a.core.unavailable is not None, 10, "the node fails closed")
        health = a.health()
        assert health["status"] == "degraded"
        assert any("Redis" in r for r in health["reasons"]), health
        await until(lambda: client.last_error is not None
                    and client.last_error[0] == "unavailable", 10, "the client told why")
        assert client.acked == 1  # the talk was never saved: not acknowledged
        assert a.core.world.npc_state(npc)["talking_to"] == ""  # and not kept in memory
        redis_server.start()  # same port and directory: the AOF brings the world back
        await asyncio.wait_for(client.wait_acked(2), 30)  # re-sent after the outage, saved
        assert a.core.unavailable is None
        await until(lambda: a.core.world.npc_state(npc)["talking_to"] == "alice", 10, "applied")
        r = redis_server.client()
        assert r.hget("{flashnpc}:cseq", "alice") == "2"
        assert a.core.outages_total == 1
        await client.close()
        await task


async def test_hostile_connections_to_a_cluster_node_are_refused_as_on_one_node(
        redis_server, tmp_path):
    cases = generate(SYNC)[:120]
    args = ("--world", "sim:60:60:500", "--tick-hz", "50", "--rate", "200",
            "--redis", redis_server.url, "--area-size", "250", "--lease-ms", "600")
    with serve(tmp_path, *args, "--node-id", "n0", name="n0") as n0, \
            serve(tmp_path, *args, "--node-id", "n1", name="n1") as n1:
        _, failures = await asyncio.to_thread(run_attacks, int(n0.ports[0]), cases,
                                              decode_server)
        assert failures == []
        bob = Client([f"ws://127.0.0.1:{n0.ports[0]}", f"ws://127.0.0.1:{n1.ports[0]}"],
                     fuzz_token("bob"), position=(200.0, 200.0))
        task = asyncio.create_task(bob.run())
        await asyncio.wait_for(bob.synced.wait(), 20)
        await bob.send_intent(pos=(201.0, 200.0))
        await asyncio.wait_for(bob.wait_acked(), 20)  # the attacked node still serves
        await bob.close()
        await task
        logs = n0.stderr() + n1.stderr()
    assert "Traceback" not in logs and "Exception" not in logs, logs[-3000:]
