"""Two in-process nodes on one Redis: each simulates its own areas and mirrors the others', so
a client on either node gets exactly the deltas of its interest, whoever simulates the NPC."""

from __future__ import annotations

import asyncio

from server_sync import Client

from ..conftest import token, until
from .conftest import all_owned, cluster_node


async def test_a_client_gets_the_deltas_of_an_npc_another_node_simulates(redis_server):
    async with cluster_node(redis_server.url, "a") as a, cluster_node(redis_server.url, "b") as b:
        await until(lambda: all_owned(a, b), 20, "both nodes own areas")
        area = sorted(a.cluster.owned)[0]
        npc = a.cluster.area_npcs[area][0]
        x, y = b.core.world.npc_position(npc)
        seen = []
        client = Client(f"ws://127.0.0.1:{b.port}", token("bob"), position=(x, y),
                        on_change=lambda ch: seen.append(ch) if ch.npc_id == npc else None)
        task = asyncio.create_task(client.run())
        await asyncio.wait_for(client.synced.wait(), 10)
        assert npc in client.replica.npcs and npc not in b.cluster.owned
        first = client.replica.npcs[npc]["state"]["state"]
        await until(lambda: client.replica.npcs[npc]["state"]["state"] != first, 10,
                    "a state change simulated on node a, seen through node b")
        assert any(c.kind == "set" and c.key == "state" for c in seen)
        await client.send_intent(talk=(npc, "trade"))  # forwarded to node a's area
        await asyncio.wait_for(client.wait_acked(), 10)
        await until(lambda: client.replica.npcs[npc]["state"].get("talking_to") == "bob", 10,
                    "the talk applied by the owner, its effect mirrored back")
        assert a.core.world.npc_state(npc)["last_intent"] == "trade"
        assert a.cluster.intents_consumed_total == 1 and b.cluster.intents_forwarded_total == 1
        await client.close()
        await task


async def test_a_node_exposes_its_cluster_metrics_and_each_is_documented(redis_server):
    from pathlib import Path

    from server_sync.sync.http_port import _Collector

    async with cluster_node(redis_server.url, "a") as a:
        await until(lambda: len(a.cluster.owned) == len(a.cluster.areas), 20, "all areas owned")
        families = {f.name: f for f in _Collector(a).collect()}
    cluster = {n: f for n, f in families.items() if n.startswith("flashnpc_cluster_")}
    assert cluster["flashnpc_cluster_areas_owned"].samples[0].value == 4
    assert cluster["flashnpc_cluster_takeovers"].samples[0].value == 4
    doc = (Path(__file__).parents[3] / "docs" / "metrics.md").read_text()
    for name, f in cluster.items():
        assert f"`{name}_total`" in doc if f.type == "counter" else f"`{name}`" in doc, name


async def test_frozen_nodes_stop_their_trees_but_keep_following_the_stream(redis_server):
    async with cluster_node(redis_server.url, "a") as a, cluster_node(redis_server.url, "b") as b:
        await until(lambda: all_owned(a, b), 20, "both nodes own areas")
        b.core.frozen = True  # b first: a's trees still change the world meanwhile
        ticks = b.core.ticks
        await until(lambda: b.core.ticks > ticks + 25, 10, "b ticks on, frozen")
        a.core.frozen = True
        states = lambda n: {i: n.core.world.npc_state(i) for i in n.core.world.npc_ids()}  # noqa: E731
        await until(lambda: states(a) == states(b), 10, "b mirrors what a did before it froze")
        assert b.core.frozen and b.cluster.frozen
