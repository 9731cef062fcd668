"""plugin.World client mode: remote NPCs whose state is applied from outside (a server) drive
events and lines like local state changes, while their trees never tick; approach barks off."""

from __future__ import annotations

from typing import Any

import pytest

from plugin import LineDropped, StateChanged, World, WorldError

# Locally the SIMPLE tree turns 'friendly' as soon as a player is near: a remote NPC must not.
from .test_world import SIMPLE, lines


def state_changes(events: list[Any]) -> list[StateChanged]:
    return [e for e in events if isinstance(e, StateChanged)]


def run_frames(world: World, n: int, dt: float = 0.1) -> list[Any]:
    out: list[Any] = []
    for _ in range(n):
        out.extend(world.update(dt))
    return out


def test_a_client_mode_world_never_ticks_its_npcs_trees(generator: Any) -> None:
    world = World(generator, seed=1, deterministic=True, mode="client")
    npc = world.add_npc("n", "farmer", SIMPLE, position=(0, 0))
    world.add_player("p", "Aria", (1, 0))
    events = run_frames(world, 30)
    assert npc.remote and npc.tree.tick_count == 0 and world.stats()["tree_ticks"] == 0
    assert npc.blackboard.get("player_near") is True  # the world's own inputs are still written
    assert npc.blackboard.get("state") == "idle"  # ... but no tree reacted to them here
    assert state_changes(events) == []
    (line,) = lines(events)  # proximity still makes the NPC bark, in the state it was given
    assert (line.npc_id, line.intent, line.state) == ("n", "approach", "idle")


def test_remote_state_is_reported_like_a_local_change(generator: Any) -> None:
    world = World(generator, seed=2, mode="client")
    world.add_npc("n", "farmer", SIMPLE)
    world.apply_remote_state("n", "state", "alert")
    world.apply_remote_state("n", "mood", "grim")
    world.apply_remote_state("n", "mood", "grim")  # unchanged: no event
    events = world.update(0.1)
    assert [(e.npc_id, e.key, e.old, e.new, e.remote) for e in state_changes(events)] == [
        ("n", "state", "idle", "alert", True), ("n", "mood", None, "grim", True)]
    assert world.npc_state("n") == "alert"
    stats = world.stats()
    assert (stats["state_changes"], stats["remote_updates"], stats["remote_npcs"]) == (2, 3, 1)


def test_a_line_is_generated_in_the_state_the_server_set(generator: Any) -> None:
    world = World(generator, seed=3, deterministic=True, mode="client")
    world.add_npc("n", "guard", SIMPLE, position=(0, 0), radius=3.0)
    world.add_player("p", "Aria", (20, 0))
    world.apply_remote_state("n", "state", "fighting")  # a tree name: state_map makes it combat
    run_frames(world, 2)
    world.move_player("p", (1, 0))
    (line,) = lines(run_frames(world, 5))
    assert (line.npc_id, line.player_id, line.state) == ("n", "p", "combat")


def test_a_remote_silent_key_keeps_the_npc_from_barking(generator: Any) -> None:
    world = World(generator, seed=4, deterministic=True, mode="client")
    world.add_npc("n", "farmer", SIMPLE, position=(0, 0))
    world.add_player("p", "Aria", (30, 0))
    world.apply_remote_state("n", "silent", True)
    world.move_player("p", (1, 0))
    assert lines(run_frames(world, 5)) == [] and world.stats()["requests"] == 0


def test_a_remote_state_change_mid_flight_regenerates_a_dialogue_turn(gated: Any) -> None:
    world = World(gated, seed=5, mode="client")
    world.add_npc("n", "farmer", SIMPLE, position=(0, 0))
    world.add_player("p", "Aria", (30, 0))
    rid = world.talk("n", "p", "ask_rumors")
    run_frames(world, 3)
    assert [s for _, s, _ in gated.submitted] == ["idle"]
    world.apply_remote_state("n", "state", "alert")  # the server's tree changed state meanwhile
    gated.release()
    events = world.update(0.1)
    assert [(e.reason, e.regenerating) for e in events if isinstance(e, LineDropped)] == [("stale", True)]
    assert lines(events) == []
    gated.release()
    (line,) = lines(world.update(0.1))
    assert (line.request_id, line.state, line.regenerated) == (rid, "alert", 1)


def test_a_talk_to_a_remote_npc_waits_for_the_servers_answer_or_two_tick_periods(gated: Any) -> None:
    world = World(gated, seed=6, mode="client", tick_rate_hz=10.0)
    world.add_npc("n", "guard", SIMPLE, position=(0, 0))
    world.add_player("p", "Aria", (30, 0))
    world.talk("n", "p", "threaten")
    world.update(0.05)
    assert gated.submitted == []  # the server's tree has not answered yet
    world.apply_remote_state("n", "state", "combat")
    world.update(0.05)
    assert [s for _, s, _ in gated.submitted] == ["combat"]
    # no answer at all: sent after two tick periods in the state the NPC has
    world.talk("n", "p", "greet")
    world.update(0.1)
    assert len(gated.submitted) == 1
    world.update(0.1)
    assert [s for _, s, _ in gated.submitted] == ["combat", "combat"]


def test_set_remote_stops_and_restarts_a_local_npcs_tree(generator: Any) -> None:
    world = World(generator, seed=7)
    npc = world.add_npc("n", "farmer", SIMPLE, position=(0, 0))
    world.add_player("p", "Aria", (1, 0))
    run_frames(world, 3)
    assert npc.blackboard.get("state") == "friendly" and npc.tree.tick_count > 0
    world.set_remote("n")
    ticks = npc.tree.tick_count
    world.move_player("p", (30, 0))
    run_frames(world, 10)
    assert npc.tree.tick_count == ticks and npc.blackboard.get("state") == "friendly"
    world.set_remote("n", False)
    events = run_frames(world, 3)
    assert npc.tree.tick_count > ticks and npc.blackboard.get("state") == "idle"
    assert [(e.new, e.remote) for e in state_changes(events)] == [("idle", False)]
    world.set_remote("n")
    world.remove_npc("n")  # a remote NPC is removed like a local one
    assert world.stats()["npcs"] == 0 and world.stats()["remote_npcs"] == 0


def test_approach_barks_off_requests_no_lines_but_talk_still_does(generator: Any) -> None:
    world = World(generator, seed=8, deterministic=True, approach_barks=False)
    world.add_npc("n", "farmer", SIMPLE, position=(0, 0))
    world.add_player("p", "Aria", (1, 0))
    assert lines(run_frames(world, 10)) == [] and world.stats()["requests"] == 0
    rid = world.talk("n", "p", "greet")
    (line,) = lines(run_frames(world, 3))
    assert line.request_id == rid
    world.approach_barks = True
    world.move_player("p", (30, 0))
    run_frames(world, 300)  # past the cooldown talk restarted
    world.move_player("p", (1, 0))
    assert [e.intent for e in lines(run_frames(world, 3))] == ["approach"]


@pytest.mark.parametrize(("call", "message"), [
    (lambda w: w.apply_remote_state("local", "state", "alert"), "is local"),
    (lambda w: w.apply_remote_state("ghost", "state", "alert"), "no NPC with id 'ghost'"),
    (lambda w: w.apply_remote_state("remote", "player_near", True), "written by this world"),
    (lambda w: w.apply_remote_state("remote", "", 1), "non-empty string"),
    (lambda w: w.apply_remote_state("remote", "count", "many"), "count"),
    (lambda w: w.set_remote("remote", "yes"), "remote must be a bool"),
    (lambda w: w.add_npc("x", "farmer", SIMPLE, remote=1), "remote must be a bool"),
])
def test_bad_client_mode_input_raises_and_changes_nothing(generator: Any, call: Any, message: str) -> None:
    world = World(generator, seed=9)
    world.add_npc("local", "farmer", SIMPLE)
    world.add_npc("remote", "farmer", SIMPLE, context={"count": 3}, remote=True)
    world.update(0.1)
    with pytest.raises(WorldError, match=message):
        call(world)
    assert world.update(0.1) == [] and world.stats()["npcs"] == 2
    assert world.npcs["remote"].blackboard.get("count") == 3
    assert world.stats()["remote_updates"] == 0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"mode": "server"}, "mode must be 'local' or 'client'"),
    ({"approach_barks": 0}, "approach_barks must be a bool"),
])
def test_bad_world_options_raise(generator: Any, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(WorldError, match=message):
        World(generator, **kwargs)
