"""The sans-I/O core and replica: seq, coalescing, interest, resume window, gaps, intents."""

import random

import pytest

from server_sync.sync.core import SyncCore
from server_sync.sync.protocol import decode_server
from server_sync.sync.replica import GapError, Replica
from server_sync.sync.world import TreeWorld, sim_world
from server_sync.transport.wire import ProtocolError


def line_world(n=10, spacing=10.0):
    """n villagers on the x axis, every `spacing` units; changes only when a test sets them."""
    world = sim_world(n, changes_per_s=1e-6, size=1.0)
    for k in range(n):
        world.move_npc(f"npc{k}", (k * spacing, 0.0))
    return world


def hello(core, player, pos=(0.0, 0.0), resume=None, codec="msgpack"):
    msg = {"t": "hello", "v": 1, "token": "t", "pos": list(pos)}
    if resume is not None:
        msg["resume"] = resume
    return core.hello(player, msg, codec)


def drain(session):
    frames, session.outbox = session.outbox, []
    return [decode_server(f)[0] for f in frames]


@pytest.fixture
def core():
    c = SyncCore(line_world(), radius=25.0, hysteresis=1.0, ring_size=4)
    c.tick(0.01, 0.0)  # let the trees write their first state
    return c


def test_hello_sends_a_snapshot_of_the_npcs_in_radius_only(core):
    s = hello(core, "p1", (0.0, 0.0))
    snap, ack = drain(s)
    assert ack == {"t": "ack", "cseq": 0}  # "you are in sync; no intent applied yet"
    assert snap["t"] == "snapshot" and snap["seq"] == 0 and snap["epoch"] == core.epoch
    assert sorted(snap["npcs"]) == ["npc0", "npc1", "npc2"]
    assert snap["npcs"]["npc1"] == {"pos": [10.0, 0.0], "state": core.world.npc_state("npc1")}


def test_changes_within_a_tick_coalesce_into_one_delta_with_the_latest_value(core):
    s = hello(core, "p1")
    drain(s)
    core.world.apply_state("npc1", "state", "a")
    core.world.apply_state("npc1", "state", "b")
    core.world.apply_state("npc2", "talking_to", "x")
    core.world.apply_state("npc9", "state", "far away")  # outside the radius
    assert core.tick(0.0, 1.0) == [s]
    (delta,) = drain(s)
    assert delta == {"t": "delta", "seq": 1, "time": 1000.0,
                     "set": {"npc1": {"state": "b"}, "npc2": {"talking_to": "x"}}}


def test_a_tick_without_changes_in_the_area_sends_nothing(core):
    s = hello(core, "p1")
    drain(s)
    core.world.apply_state("npc9", "state", "far away")
    assert core.tick(0.0, 1.0) == []
    assert s.seq == 0


def test_moving_sends_enter_and_leave_with_full_state_of_entering_npcs(core):
    s = hello(core, "p1")
    drain(s)
    core.receive(s, {"t": "intent", "cseq": 1, "pos": [50.0, 0.0]})
    core.tick(0.0, 1.0)
    (delta,) = drain(s)
    assert delta["ack"] == 1  # the intent's ack rides on the delta it caused
    assert delta["leave"] == ["npc0", "npc1", "npc2"]
    assert sorted(delta["enter"]) == ["npc3", "npc4", "npc5", "npc6", "npc7"]
    assert delta["enter"]["npc5"]["state"] == core.world.npc_state("npc5")


def test_an_npc_leaving_and_reentering_within_one_tick_sends_nothing(core):
    s = hello(core, "p1")
    drain(s)
    core.world.move_npc("npc1", (500.0, 0.0))
    core.world.move_npc("npc1", (11.0, 0.0))
    core.tick(0.0, 1.0)
    (delta,) = drain(s)
    assert delta == {"t": "delta", "seq": 1, "time": 1000.0, "move": {"npc1": [11.0, 0.0]}}


def test_npc_moves_across_the_radius_enter_and_leave(core):
    s = hello(core, "p1")
    drain(s)
    core.world.move_npc("npc1", (500.0, 0.0))
    core.world.move_npc("npc9", (5.0, 0.0))
    core.tick(0.0, 1.0)
    (delta,) = drain(s)
    assert delta["leave"] == ["npc1"] and list(delta["enter"]) == ["npc9"]


def changes(core, s, n, t0=1.0):
    for k in range(n):
        core.world.apply_state("npc1", "state", f"s{k}")
        core.tick(0.0, t0 + k)


def test_resume_inside_the_window_replays_exactly_the_missed_deltas(core):
    s = hello(core, "p1")
    replica = Replica()
    for m in drain(s):
        replica.apply(m)
    changes(core, s, 2)
    for m in drain(s):
        replica.apply(m)
    core.detach(s, 3.0)
    changes(core, s, 3, t0=4.0)  # missed while away (ring holds 4)
    assert drain(s) == []
    s2 = hello(core, "p1", resume=replica.resume_token())
    assert s2 is s
    *replayed, ack = drain(s)
    assert [m["seq"] for m in replayed] == [3, 4, 5] and ack == {"t": "ack", "cseq": 0}
    for m in replayed:
        replica.apply(m)
    assert replica.npcs == core.area_of("p1")["npcs"] and replica.seq == 5


@pytest.mark.parametrize("resume", [{"epoch": "other", "seq": 1}, {"epoch": None, "seq": 99}])
def test_resume_with_another_epoch_or_a_future_seq_gets_a_snapshot(core, resume):
    s = hello(core, "p1")
    drain(s)
    changes(core, s, 2)
    drain(s)
    core.detach(s, 3.0)
    resume["epoch"] = resume["epoch"] or core.epoch
    hello(core, "p1", resume=resume)
    snap, _ = drain(s)
    assert snap["t"] == "snapshot" and snap["seq"] == 2


def test_resume_outside_the_window_gets_a_snapshot(core):
    s = hello(core, "p1")
    drain(s)
    core.detach(s, 1.0)
    changes(core, s, 6)  # the ring keeps 4 deltas: seq 1..2 are gone
    hello(core, "p1", resume={"epoch": core.epoch, "seq": 0})
    snap, _ = drain(s)
    assert snap["t"] == "snapshot" and snap["seq"] == 6
    assert snap["npcs"]["npc1"]["state"]["state"] == "s5"


def test_a_gap_raises_and_resync_answers_with_a_snapshot(core):
    s = hello(core, "p1")
    replica = Replica()
    replica.apply(drain(s)[0])
    changes(core, s, 2)
    _, second = drain(s)
    with pytest.raises(GapError, match="expected delta seq 1, got 2"):
        replica.apply(second)
    assert replica.seq == 0  # nothing applied
    core.receive(s, {"t": "resync", "seq": replica.seq})
    (snap,) = drain(s)
    replica.apply(snap)
    assert replica.seq == 2 and replica.npcs == core.area_of("p1")["npcs"]


def test_an_intent_sent_twice_is_applied_once_and_acknowledged_both_times(core):
    s = hello(core, "p1")
    drain(s)
    talk = {"t": "intent", "cseq": 1, "talk": {"npc": "npc1", "intent": "greet"}}
    core.receive(s, talk)
    core.receive(s, talk)  # duplicate before the tick: acknowledged with the tick
    core.tick(0.0, 1.0)
    (delta,) = drain(s)  # the talk changed npc1's state: the ack rides on that delta
    assert delta["ack"] == 1 and delta["set"]["npc1"]["last_intent"] == "greet"
    core.world.apply_state("npc1", "last_intent", "reset")
    core.tick(0.0, 2.0)
    drain(s)
    core.receive(s, talk)  # duplicate after the ack: acknowledged at once, not applied
    assert drain(s) == [{"t": "ack", "cseq": 1}]
    core.tick(0.0, 3.0)
    assert core.world.npc_state("npc1")["last_intent"] == "reset"
    assert core.intents_total == 1 and core.duplicate_intents_total == 2


def test_a_second_hello_on_an_authenticated_session_is_refused(core):
    s = hello(core, "p1")
    with pytest.raises(ProtocolError, match="already authenticated"):
        core.receive(s, {"t": "hello", "v": 1, "token": "t"})


def test_an_unsupported_version_is_refused(core):
    with pytest.raises(ProtocolError) as err:
        core.hello("p1", {"t": "hello", "v": 2, "token": "t"}, "msgpack")
    assert err.value.code == "unsupported_version"


def test_detached_sessions_expire_after_the_grace_period():
    core = SyncCore(line_world(), radius=25.0, grace_s=5.0)
    s = hello(core, "p1")
    core.detach(s, 0.0)
    for k in range(1, 11):
        core.tick(0.0, 0.5 * k)  # expiry is checked every 10 ticks
    assert "p1" in core.sessions
    for k in range(11, 21):
        core.tick(0.0, 0.5 * k)
    assert "p1" not in core.sessions and "p1" not in core.world.players


@pytest.mark.parametrize("seed", range(3))
def test_replicas_equal_the_server_area_after_random_moves_changes_and_drops(seed):
    rng = random.Random(seed)
    world = sim_world(150, changes_per_s=300, size=300.0, seed=seed)
    core = SyncCore(world, radius=40.0, ring_size=8)
    replicas = {}
    sessions = {}
    for k in range(12):
        p = f"p{k}"
        sessions[p] = hello(core, p, (rng.uniform(0, 300), rng.uniform(0, 300)))
        replicas[p] = Replica()
    cseq = dict.fromkeys(sessions, 0)

    def pump():
        for p, s in sessions.items():
            for m in drain(s):
                try:
                    replicas[p].apply(m)
                except GapError:
                    core.receive(s, {"t": "resync", "seq": replicas[p].seq})
    pump()
    away = set()
    for step in range(300):
        for p, s in sessions.items():
            if p not in away and rng.random() < 0.3:
                cseq[p] += 1
                core.receive(s, {"t": "intent", "cseq": cseq[p],
                                 "pos": [rng.uniform(0, 300), rng.uniform(0, 300)]})
        if rng.random() < 0.05:
            world.move_npc(f"npc{rng.randrange(150)}", (rng.uniform(0, 300), rng.uniform(0, 300)))
        core.tick(0.05, step * 0.05)
        pump()
        if rng.random() < 0.1:
            p = rng.choice(sorted(sessions))
            if p in away:
                away.discard(p)
                hello(core, p, resume=replicas[p].resume_token())
            else:
                away.add(p)
                core.detach(sessions[p], step * 0.05)
    for p in away:
        hello(core, p, resume=replicas[p].resume_token())
    pump()
    assert core.replays_total > 0
    for p, r in replicas.items():
        area = core.area_of(p)
        assert (r.seq, r.npcs) == (area["seq"], area["npcs"])


def test_tree_world_rejects_duplicate_npcs():
    world = TreeWorld()
    w2 = sim_world(1)
    with pytest.raises(ValueError, match="already exists"):
        world.add_npc("a", w2.npcs["npc0"].tree, (0, 0))
        world.add_npc("a", w2.npcs["npc0"].tree, (0, 0))


def test_resume_with_nothing_missed_gets_just_the_ack_that_says_in_sync(core):
    s = hello(core, "p1")
    replica = Replica()
    for m in drain(s):
        replica.apply(m)
    core.receive(s, {"t": "intent", "cseq": 1, "pos": [1.0, 0.0]})
    core.tick(0.0, 1.0)
    drain(s)
    core.detach(s, 1.0)
    hello(core, "p1", resume=replica.resume_token())
    assert drain(s) == [{"t": "ack", "cseq": 1}]
