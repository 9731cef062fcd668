"""Server authority (issue #15): talk targets, range, area and catalog; movement speed and world
bounds; teleports only as admin moves; the hello's position only for a new player. Each refusal
names its rule, and the refused intent is still acknowledged."""

import asyncio

import aiohttp
import pytest

from server_sync import Client, ServerConfig, SyncServer
from server_sync.sync.core import SyncCore
from server_sync.sync.persistence import Store
from server_sync.sync.protocol import decode_server
from server_sync.sync.world import TALK_INTENTS, sim_world

from ..conftest import SECRET, token, until


def spread_world():
    """npc0 at the origin, npc1 at (50, 0), npc2 at (4000, 0); nothing changes by itself."""
    world = sim_world(3, changes_per_s=1e-6, size=1.0)
    for k, x in enumerate((0.0, 50.0, 4000.0)):
        world.move_npc(f"npc{k}", (x, 0.0))
    return world


def new_core(**kw):
    core = SyncCore(spread_world(), radius=100.0, **kw)
    core.tick(0.01, 100.0)
    return core


def join(core, player, pos=(0.0, 0.0)):
    s = core.hello(player, {"t": "hello", "v": 1, "token": "t", "pos": list(pos)}, "msgpack")
    s.outbox.clear()
    return s


def drain(s):
    frames, s.outbox = s.outbox, []
    return [decode_server(f)[0] for f in frames]


def refusals(msgs):
    return [m for m in msgs if m["t"] == "refused"]


def acked(msgs):
    return max([m["cseq"] for m in msgs if m["t"] == "ack"] + [m["ack"] for m in msgs if "ack" in m])


@pytest.mark.parametrize(("talk", "rule", "needle"), [
    ({"npc": "ghost", "intent": "greet"}, "unknown_npc", "no NPC 'ghost'"),
    ({"npc": "npc1", "intent": "dance"}, "unknown_intent", "not an intent of the catalog"),
    ({"npc": "npc2", "intent": "greet"}, "not_in_area", "4000.0 units away"),
])
def test_a_talk_the_server_does_not_allow_is_refused_naming_the_rule_and_still_acknowledged(
        talk, rule, needle):
    core = new_core()
    s = join(core, "p1")
    core.receive(s, {"t": "intent", "cseq": 1, "talk": talk})
    core.tick(0.01, 101.0)
    msgs = drain(s)
    (refused,) = refusals(msgs)
    assert refused["cseq"] == 1 and refused["rule"] == rule and needle in refused["reason"]
    assert msgs.index(refused) < len(msgs) - 1 and acked(msgs) == 1  # refusal, then the ack
    assert all(core.world.npc_state(n)["talking_to"] == "" for n in ("npc0", "npc1", "npc2"))
    assert core.refused_total == 1 and core.intents_total == 0


def test_a_talk_beyond_the_talk_range_is_refused_too_far():
    core = new_core(talk_range=20.0)
    s = join(core, "p1")
    core.receive(s, {"t": "intent", "cseq": 1, "talk": {"npc": "npc1", "intent": "trade"}})
    core.receive(s, {"t": "intent", "cseq": 2, "talk": {"npc": "npc0", "intent": "trade"}})
    core.tick(0.01, 101.0)
    (refused,) = refusals(drain(s))
    assert (refused["cseq"], refused["rule"]) == (1, "too_far")
    assert "talk range 20" in refused["reason"]
    assert core.world.npc_state("npc0")["talking_to"] == "p1"  # in range: applied


def test_a_far_talk_never_reaches_a_witness_next_to_the_npc():
    core = new_core()
    talker = join(core, "talker", (0.0, 0.0))
    witness = join(core, "witness", (4000.0, 10.0))
    core.tick(0.01, 101.0)
    drain(witness)
    core.receive(talker, {"t": "intent", "cseq": 1, "talk": {"npc": "npc2", "intent": "threaten"}})
    core.tick(0.01, 102.0)
    assert drain(witness) == []
    assert core.world.npc_state("npc2")["last_intent"] == ""


def test_the_catalog_of_the_sim_world_is_the_shipped_models():
    from runtime import LineGenerator

    assert list(TALK_INTENTS) == LineGenerator.fallback_only().catalog()["intents"]


@pytest.mark.parametrize("pos", [[1e308, 0.0], [-1e308, -1e308], [0.0, 150.0]])
def test_a_move_outside_the_world_is_refused_and_the_client_hears_where_it_is(pos):
    core = new_core()
    s = join(core, "p1", (10.0, 0.0))
    core.receive(s, {"t": "intent", "cseq": 1, "pos": pos})
    core.tick(0.01, 101.0)
    (refused,) = refusals(drain(s))
    assert refused["rule"] == "out_of_bounds" and "outside the world" in refused["reason"]
    assert refused["pos"] == [10.0, 0.0]
    assert core.world.players["p1"] == (10.0, 0.0)


def test_a_move_faster_than_the_max_speed_is_refused_walking_is_not():
    core = new_core(max_speed=10.0, move_burst_s=1.0)
    s = join(core, "p1", (0.0, 0.0))
    for k in range(1, 6):  # 5 units per tick at 1 s per tick: walking pace, bunched or not
        core.receive(s, {"t": "intent", "cseq": k, "pos": [5.0 * k, 0.0]})
        core.tick(0.01, 100.0 + k)
    assert refusals(drain(s)) == []
    core.receive(s, {"t": "intent", "cseq": 6, "pos": [25.0, 40.0]})  # 40 units in 1 s
    core.tick(0.01, 106.0)
    (refused,) = refusals(drain(s))
    assert refused["rule"] == "too_fast" and "max speed 10 units/s" in refused["reason"]
    assert refused["pos"] == [25.0, 0.0] and core.world.players["p1"] == (25.0, 0.0)


def test_idle_time_does_not_bank_a_teleport():
    core = new_core(max_speed=10.0, move_burst_s=2.0)
    s = join(core, "p1")
    core.receive(s, {"t": "intent", "cseq": 1, "pos": [30.0, 0.0]})  # 30 > 2 s at 10/s
    core.tick(0.01, 10_000.0)
    assert refusals(drain(s))[0]["rule"] == "too_fast"


def test_a_refused_move_refuses_the_talk_that_rides_with_it():
    core = new_core(max_speed=1.0)
    s = join(core, "p1")
    core.receive(s, {"t": "intent", "cseq": 1, "pos": [60.0, 0.0],
                     "talk": {"npc": "npc1", "intent": "greet"}})
    core.tick(0.01, 101.0)
    assert refusals(drain(s))[0]["rule"] == "too_fast"
    assert core.world.npc_state("npc1")["talking_to"] == ""


def test_a_teleport_is_an_admin_move_past_the_speed_rule_and_the_client_hears_of_it():
    core = new_core(max_speed=1.0)
    s = join(core, "p1")
    core.teleport("p1", (90.0, 5.0))
    core.tick(0.01, 101.0)
    (delta,) = drain(s)
    assert delta["t"] == "delta" and delta["pos"] == [90.0, 5.0]
    assert core.world.players["p1"] == (90.0, 5.0)
    with pytest.raises(ValueError, match="outside the world"):
        core.teleport("p1", (1e9, 0.0))
    with pytest.raises(ValueError, match="no player"):
        core.teleport("nobody", (1.0, 0.0))


def test_hello_pos_is_used_only_when_the_server_has_no_position_for_the_player(tmp_path):
    path = tmp_path / "w.sqlite"
    core = SyncCore(spread_world(), radius=100.0, store=Store(path))
    s = join(core, "p1", (5.0, 0.0))
    core.receive(s, {"t": "intent", "cseq": 1, "pos": [20.0, 0.0]})
    core.tick(0.01, 100.0)
    core.store.close()
    restarted = SyncCore(spread_world(), radius=100.0, store=Store(path))
    s = restarted.hello("p1", {"t": "hello", "v": 1, "token": "t", "pos": [70.0, 0.0]}, "json")
    snapshot = decode_server(s.outbox[0])[0]
    assert snapshot["pos"] == [20.0, 0.0]  # the recovered position, not the hello's
    fresh = join(restarted, "p2", (70.0, 0.0))
    assert restarted.players.position("p2") == (70.0, 0.0) and fresh.player_id == "p2"


async def test_refusals_and_admin_teleports_over_the_wire():
    world = spread_world()
    config = ServerConfig(secret=SECRET, port=0, http_port=0, admin_token="adm", max_speed=5.0,
                          tick_hz=50.0)
    async with SyncServer(world, config) as srv:
        seen = []
        client = Client(f"ws://127.0.0.1:{srv.port}", token("p1"), position=(0.0, 0.0),
                        on_refused=seen.append)
        task = asyncio.create_task(client.run())
        await until(client.synced.is_set, 10, "synced")
        await client.send_intent(pos=(1000.0, 0.0))  # too fast
        await client.wait_acked()
        assert seen[0]["rule"] == "too_fast" and client.refused["too_fast"] == 1
        assert client.position == (0.0, 0.0)  # where the server has the player
        base = f"http://127.0.0.1:{srv.http_port}"
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{base}/admin/teleport?player=p1&x=40&y=0") as r:
                assert r.status == 401
            async with http.post(f"{base}/admin/teleport?player=p1&x=40&y=0",
                                 headers={"Authorization": "Bearer adm"}) as r:
                assert r.status == 200
            async with http.post(f"{base}/admin/teleport?player=p1&x=1e9&y=0",
                                 headers={"Authorization": "Bearer adm"}) as r:
                assert r.status == 400 and "outside the world" in await r.text()
        await until(lambda: client.position == (40.0, 0.0), 10, "the client hears of the move")
        assert client.replica.player_pos == [40.0, 0.0]
        await client.close()
        await task
