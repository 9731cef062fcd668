"""plugin.World: proximity, cooldown, talking, the stale-line policy, callbacks, determinism,
bad input."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest

from behavior_tree import Factory
from plugin import Line, LineDropped, LinePiece, StateChanged, World, WorldError
from plugin.village import village_tree

SIMPLE = """
<root BTCPP_format="4">
  <BehaviorTree ID="Simple">
    <ReactiveSequence>
      <Script code="state := player_near ? 'friendly' : 'idle'"/>
      <Sleep msec="1000"/>
    </ReactiveSequence>
  </BehaviorTree>
</root>
"""


def lines(events: list[Any]) -> list[Line]:
    return [e for e in events if isinstance(e, Line)]


def run_frames(world: World, n: int, dt: float = 0.1) -> list[Any]:
    out: list[Any] = []
    for _ in range(n):
        out.extend(world.update(dt))
    return out


# --------------------------------------------------------------------------- approach & cooldown


def test_approach_triggers_exactly_one_line_per_cooldown(generator: Any) -> None:
    world = World(generator, seed=1, deterministic=True, speech_cooldown=10.0)
    world.add_npc("n", "farmer", SIMPLE, position=(0, 0), radius=3.0)
    world.add_player("p", "Aria", (20, 0))
    events = run_frames(world, 3)
    assert lines(events) == []
    # in and out of range several times within the cooldown: one line
    for _ in range(4):
        world.move_player("p", (1, 0))
        events += run_frames(world, 3)
        world.move_player("p", (20, 0))
        events += run_frames(world, 3)
    spoken = lines(events)
    assert len(spoken) == 1
    assert spoken[0].npc_id == "n" and spoken[0].player_id == "p" and spoken[0].intent == "approach"
    assert world.time < 10.0
    # after the cooldown, walking in again gives exactly one more
    run_frames(world, 100)
    world.move_player("p", (1, 0))
    later = lines(run_frames(world, 5))
    assert len(later) == 1


def test_standing_in_range_does_not_repeat_lines(generator: Any) -> None:
    world = World(generator, seed=1, deterministic=True, speech_cooldown=1.0)
    world.add_npc("n", "farmer", SIMPLE, position=(0, 0))
    world.add_player("p", "Aria", (1, 0))
    assert len(lines(run_frames(world, 50))) == 1  # 5 s in range, cooldown 1 s: no re-trigger


def test_per_npc_cooldown_overrides_the_worlds(generator: Any) -> None:
    world = World(generator, seed=1, deterministic=True, speech_cooldown=100.0)
    world.add_npc("chatty", "child", SIMPLE, position=(0, 0), speech_cooldown=2.0)
    world.add_npc("quiet", "farmer", SIMPLE, position=(1, 0))
    world.add_player("p", "Aria", (30, 0))
    spoken: list[Line] = []
    for _ in range(3):  # walk in, wait, walk out, wait: 5 s per visit
        world.move_player("p", (0.5, 0))
        spoken += lines(run_frames(world, 25))
        world.move_player("p", (30, 0))
        spoken += lines(run_frames(world, 25))
    assert [e.npc_id for e in spoken].count("chatty") == 3
    assert [e.npc_id for e in spoken].count("quiet") == 1


def test_line_reflects_the_trees_reaction_to_the_approach(generator: Any) -> None:
    world = World(generator, seed=2, deterministic=True)
    world.add_npc("n", "farmer", SIMPLE, position=(0, 0))
    world.add_player("p", "Aria", (1, 0))
    events = run_frames(world, 5)
    (line,) = lines(events)
    assert line.state == "friendly"
    changed = [e for e in events if isinstance(e, StateChanged) and e.key == "state"]
    assert changed and changed[-1].new == "friendly"
    assert events.index(changed[-1]) < events.index(line)


def test_proximity_writes_player_near_and_hostile_near(generator: Any) -> None:
    world = World(generator, deterministic=True)
    npc = world.add_npc("n", "guard", SIMPLE, position=(0, 0))
    world.add_player("p", "Aria", (50, 0))
    world.add_player("b", "a bandit", (60, 0), reputation="hostile")
    world.update(0.1)
    assert npc.blackboard.get("player_near") is False
    world.move_player("b", (2, 2))
    world.update(0.1)
    assert npc.blackboard.get("player_near") is True and npc.blackboard.get("hostile_near") is True
    world.remove_player("b")
    assert npc.blackboard.get("hostile_near") is False and npc.blackboard.get("player_near") is False


# --------------------------------------------------------------------------- talking


def test_talk_reply_conditions_on_the_state_the_tree_takes_for_the_intent(generator: Any) -> None:
    world = World(generator, seed=3, deterministic=True)
    world.add_npc("bram", "guard", village_tree("guard.xml"), persona=["gruff"], position=(0, 0),
                  context={"shift": "day"})
    world.add_player("p", "Aria", (30, 0))
    run_frames(world, 3)
    assert world.npc_state("bram") == "patrol"
    world.move_player("p", (1, 0))
    run_frames(world, 3)
    rid = world.talk("bram", "p", "threaten")
    (reply,) = [e for e in lines(run_frames(world, 3)) if e.request_id == rid]
    assert reply.intent == "threaten" and reply.state == "combat"


def test_talk_supersedes_an_ambient_line_in_flight(gated: Any) -> None:
    world = World(gated, seed=4)
    world.add_npc("n", "farmer", SIMPLE, position=(0, 0))
    world.add_player("p", "Aria", (1, 0))
    run_frames(world, 3)
    assert len(gated.pending) == 1  # the approach bark is in flight
    rid = world.talk("n", "p", "greet")
    dropped = [e for e in world.update(0.1) if isinstance(e, LineDropped)]
    assert [(d.reason, d.regenerating) for d in dropped] == [("superseded", False)]
    gated.release()
    delivered = lines(world.drain())
    assert [(e.request_id, e.intent) for e in delivered] == [(rid, "greet")]


# --------------------------------------------------------------------------- the stale-line policy


def test_state_change_mid_flight_regenerates_a_dialogue_turn(gated: Any) -> None:
    world = World(gated, seed=5)
    npc = world.add_npc("n", "farmer", SIMPLE, position=(0, 0))
    world.add_player("p", "Aria", (30, 0))
    run_frames(world, 3)
    rid = world.talk("n", "p", "ask_rumors")
    run_frames(world, 3)
    assert [s for _, s, _ in gated.submitted] == ["idle"]
    npc.blackboard.set("state", "alert")  # the NPC's state changes while the line is in flight
    gated.release()  # the stale line finishes anyway
    events = world.update(0.1)
    assert [(e.reason, e.regenerating) for e in events if isinstance(e, LineDropped)] == [("stale", True)]
    assert lines(events) == []  # the stale line is never delivered
    assert [s for _, s, _ in gated.submitted] == ["idle", "alert"]
    gated.release()
    (line,) = lines(world.update(0.1))
    assert (line.request_id, line.state, line.regenerated) == (rid, "alert", 1)
    assert world.stats()["dropped_stale"] == 1 and world.stats()["regenerated"] == 1


def test_state_change_mid_flight_drops_a_bark_when_the_player_has_left(gated: Any) -> None:
    world = World(gated, seed=6)
    npc = world.add_npc("n", "farmer", SIMPLE, position=(0, 0))
    world.add_player("p", "Aria", (1, 0))
    run_frames(world, 3)
    assert len(gated.pending) == 1
    world.move_player("p", (40, 0))
    events = world.update(0.1)  # out of range: the tree turns back to 'idle' mid-flight
    assert npc.blackboard.get("state") == "idle"
    gated.release()
    events += run_frames(world, 3)
    assert [(e.reason, e.regenerating) for e in events if isinstance(e, LineDropped)] == [("stale", False)]
    assert lines(events) == [] and gated.pending == []


def test_state_change_mid_flight_regenerates_a_bark_while_the_player_stays(gated: Any) -> None:
    world = World(gated, seed=7)
    npc = world.add_npc("n", "farmer", SIMPLE, position=(0, 0))
    world.add_player("p", "Aria", (1, 0))
    run_frames(world, 3)
    npc.blackboard.set("state", "alert")
    gated.release()
    world.update(0.1)
    gated.release()
    (line,) = lines(world.update(0.1))
    assert line.state == "alert" and line.intent == "approach" and line.regenerated == 1


def test_regeneration_is_bounded(gated: Any) -> None:
    world = World(gated, seed=8, max_regenerations=2)
    npc = world.add_npc("n", "farmer", SIMPLE, position=(0, 0))
    world.add_player("p", "Aria", (30, 0))
    world.talk("n", "p", "greet")
    run_frames(world, 3)
    events: list[Any] = []
    for state in ("alert", "flee", "combat"):  # the state flaps while each try is in flight
        npc.blackboard.set("state", state)
        gated.release()
        events += world.update(0.0)
    dropped = [(e.reason, e.regenerating) for e in events if isinstance(e, LineDropped)]
    assert dropped == [("stale", True), ("stale", True), ("stale", False)]
    assert lines(events) == [] and gated.pending == []
    assert [s for _, s, _ in gated.submitted] == ["idle", "alert", "flee"]
    assert world.stats()["regenerated"] == 2 and world.stats()["in_flight"] == 0


def test_cap_on_lines_in_flight_queues_the_rest(gated: Any) -> None:
    world = World(gated, seed=9, max_in_flight=2)
    for i in range(5):
        world.add_npc(f"n{i}", "farmer", SIMPLE, position=(i * 0.5, 0))
    world.add_player("p", "Aria", (1, 0))
    run_frames(world, 3)
    assert len(gated.pending) == 2
    assert world.stats()["in_flight"] == 2 and world.stats()["queued"] == 3
    gated.release()
    assert len(lines(world.update(0.1))) == 2
    assert len(gated.pending) == 2


def test_removing_an_npc_drops_its_lines_silently(gated: Any) -> None:
    world = World(gated, seed=10)
    world.add_npc("n", "farmer", SIMPLE, position=(0, 0))
    world.add_player("p", "Aria", (1, 0))
    run_frames(world, 3)
    world.remove_npc("n")
    gated.release()
    assert lines(run_frames(world, 3)) == []
    assert "n" not in world.npcs and len(world.grid) == 0 and len(world.scheduler) == 0


# --------------------------------------------------------------------------- callbacks


def test_a_callback_that_raises_is_logged_and_the_world_goes_on(
        generator: Any, caplog: pytest.LogCaptureFixture) -> None:
    world = World(generator, seed=11, deterministic=True)
    world.add_npc("n", "farmer", SIMPLE, position=(0, 0))
    world.add_player("p", "Aria", (1, 0))
    seen: list[Any] = []

    def boom(event: Any) -> None:
        raise RuntimeError("game bug")

    world.on(Line, boom)
    world.on(Line, seen.append)
    world.on(StateChanged, boom)
    with caplog.at_level(logging.ERROR, logger="flashnpc.plugin"):
        events = run_frames(world, 5)
    assert lines(events) and seen == lines(events)
    assert world.stats()["callback_errors"] >= 2
    assert "game bug" in caplog.text
    world.move_player("p", (30, 0))
    run_frames(world, 300)  # keeps running: past the cooldown, a second approach speaks again
    world.move_player("p", (1, 0))
    assert lines(run_frames(world, 5))


def test_unsubscribe_stops_callbacks(generator: Any) -> None:
    world = World(generator, deterministic=True)
    world.add_npc("n", "farmer", SIMPLE, position=(0, 0))
    seen: list[Any] = []
    stop = world.on(StateChanged, seen.append)
    world.npcs["n"].blackboard.set("mood", "calm")
    world.update(0.1)
    n = len(seen)
    assert [(e.key, e.new) for e in seen] == [("mood", "calm")]
    stop()
    world.npcs["n"].blackboard.set("mood", "grim")
    world.update(0.1)
    assert len(seen) == n


# --------------------------------------------------------------------------- determinism & streaming


def transcript(model_dir: Any, seed: int) -> list[tuple[Any, ...]]:
    import io

    from plugin.demo import run_village
    from runtime.client.generator import LineGenerator

    with LineGenerator.load(model_dir) as gen:
        result = run_village(gen, seed=seed, npcs=4, duration=40.0, out=io.StringIO())
    return [(e.time, e.npc_id, e.player_id, e.intent, e.state, e.text, e.fallback) for e in result["transcript"]]


def test_deterministic_mode_gives_the_same_transcript_twice(plugin_model_dir: Any) -> None:
    first = transcript(plugin_model_dir, seed=5)
    assert len(first) >= 4
    assert transcript(plugin_model_dir, seed=5) == first


def test_streamed_pieces_add_up_to_the_line(generator: Any) -> None:
    world = World(generator, seed=12, deterministic=True, stream=True)
    world.add_npc("n", "innkeeper", SIMPLE, position=(0, 0))
    world.add_player("p", "Aria", (1, 0))
    events = run_frames(world, 5)
    (line,) = lines(events)
    pieces = [e for e in events if isinstance(e, LinePiece) and e.request_id == line.request_id]
    assert "".join(p.piece for p in pieces) == line.text
    assert events.index(pieces[-1]) < events.index(line)


def test_streaming_in_a_worker_thread_delivers_the_line(generator: Any) -> None:
    with World(generator, seed=13, stream=True) as world:
        world.add_npc("n", "innkeeper", SIMPLE, position=(0, 0))
        world.add_player("p", "Aria", (1, 0))
        events = run_frames(world, 3) + world.drain()
    (line,) = lines(events)
    pieces = [e for e in events if isinstance(e, LinePiece)]
    assert "".join(p.piece for p in pieces) == line.text


# --------------------------------------------------------------------------- bad input


def assert_unchanged(world: World, npcs: int) -> None:
    assert len(world.npcs) == npcs and len(world.grid) == npcs and len(world.scheduler) == npcs


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda w: w.add_npc("x", "dragon", SIMPLE), "unknown archetype 'dragon'"),
        (lambda w: w.add_npc("x", "guard", "<root BTCPP_format='4'><BehaviorTree ID='A'><Nope/>"
                             "</BehaviorTree></root>"), "bad tree XML"),
        (lambda w: w.add_npc("x", "guard", "<root"), "bad tree XML"),
        (lambda w: w.add_npc("x", "guard", "no/such/tree.xml"), "not found"),
        (lambda w: w.add_npc("a", "guard", SIMPLE), "already exists"),
        (lambda w: w.add_npc("x", "guard", SIMPLE, position=(math.nan, 0)), "finite"),
        (lambda w: w.add_npc("x", "guard", SIMPLE, position=(1, 2, 3)), "pair of numbers"),
        (lambda w: w.add_npc("x", "guard", SIMPLE, persona=["grumpy"]), "unknown persona trait 'grumpy'"),
        (lambda w: w.add_npc("x", "guard", SIMPLE, context={"weather": "hail"}), "weather='hail'"),
        (lambda w: w.add_npc("x", "guard", SIMPLE, context={"state": "dancing"}), "state"),
        (lambda w: w.add_npc("x", "guard", SIMPLE, radius=-1), "radius"),
        (lambda w: w.add_npc(None, "guard", SIMPLE), "id must be"),
        (lambda w: w.add_npc("x", "guard", SIMPLE, context={"player_near": "yes"}), "written by the world"),
    ],
)
def test_bad_npc_input_raises_and_adds_nothing(generator: Any, call: Any, message: str) -> None:
    world = World(generator, deterministic=True)
    world.add_npc("a", "guard", SIMPLE)
    with pytest.raises(WorldError, match=message.replace("(", r"\(")):
        call(world)
    assert_unchanged(world, 1)
    assert world.update(0.1) is not None


def test_bad_player_and_call_input_raises(generator: Any) -> None:
    world = World(generator, deterministic=True)
    world.add_npc("a", "guard", SIMPLE)
    world.add_player("p", "Aria", (0, 0))
    with pytest.raises(WorldError, match="already exists"):
        world.add_player("p", "Bo", (0, 0))
    with pytest.raises(WorldError, match="finite"):
        world.add_player("q", "Bo", (0, math.inf))
    with pytest.raises(WorldError, match="unknown reputation"):
        world.add_player("q", "Bo", (0, 0), reputation="feared")
    with pytest.raises(WorldError, match="finite"):
        world.move_player("p", (math.nan, 1))
    assert world.players["p"].position == (0.0, 0.0)
    with pytest.raises(WorldError, match="no NPC with id 'zz'"):
        world.talk("zz", "p", "greet")
    with pytest.raises(WorldError, match="unknown intent 'dance'"):
        world.talk("a", "p", "dance")
    with pytest.raises(WorldError, match="dt must be"):
        world.update(math.nan)
    with pytest.raises(WorldError, match="dt must be"):
        world.update(-0.1)
    with pytest.raises(WorldError, match="time_of_day='noon'"):
        world.set_context(time_of_day="noon")
    assert list(world.players) == ["p"]


def test_a_tree_cannot_drive_two_npcs(generator: Any) -> None:
    world = World(generator, deterministic=True)
    tree = Factory().create_tree(SIMPLE)
    world.add_npc("a", "guard", tree)
    with pytest.raises(WorldError, match="already drives"):
        world.add_npc("b", "guard", tree)
    assert_unchanged(world, 1)


def test_a_tree_object_is_driven_by_the_world_and_keeps_its_user_data(generator: Any) -> None:
    world = World(generator, deterministic=True)
    tree = world.factory.create_tree(SIMPLE)
    tree.user_data = "mine"
    world.add_npc("a", "farmer", tree, position=(0, 0))
    world.add_player("p", "Aria", (1, 0))
    assert lines(run_frames(world, 5)) and tree.user_data == "mine"
    assert tree.blackboard.get("state") == "friendly"


def test_a_tree_object_whose_keys_clash_with_the_worlds_is_refused(generator: Any) -> None:
    world = World(generator, deterministic=True)
    tree = world.factory.create_tree(SIMPLE)
    tree.blackboard.set("player_near", "no")
    with pytest.raises(WorldError, match="'player_near' holds str"):
        world.add_npc("a", "farmer", tree)
    assert_unchanged(world, 0)
    assert "state" not in tree.blackboard


def test_state_names_are_mapped_to_the_models_states(generator: Any) -> None:
    xml = SIMPLE.replace("'friendly' : 'idle'", "'trading' : 'patrolling'")
    world = World(generator, deterministic=True, state_map={"trading": "working"})
    world.add_npc("a", "merchant", xml, position=(0, 0))
    world.update(0.2)
    assert world.npc_state("a") == "patrol"
    world.add_player("p", "Aria", (1, 0))
    (line,) = lines(run_frames(world, 5))
    assert line.state == "working"


WATCHER = """
<root BTCPP_format="4">
  <BehaviorTree ID="Watcher">
    <ReactiveFallback>
      <Script _skipIf="!player_near" code="state := 'friendly'"/>
      <Sequence>
        <Script code="state := 'idle'"/>
        <Sleep msec="10000"/>
      </Sequence>
    </ReactiveFallback>
  </BehaviorTree>
</root>
"""


def test_a_tree_woken_early_and_asleep_again_still_hears_the_player(generator: Any) -> None:
    # sleep 1 ends at 10.0; the player wakes it at 0.3 and leaves at 0.6, so it sleeps again
    # until ~10.6; the first sleep's timer fires at 10.0 in between. A player arriving at
    # 10.2 must still be noticed within a tick or two, not at 10.6.
    world = World(generator, seed=0, deterministic=True)
    npc = world.add_npc("w", "farmer", WATCHER, position=(0, 0))
    world.add_player("p", "Aria", (30, 0))
    run_frames(world, 3)
    world.move_player("p", (1, 0))
    run_frames(world, 3)
    assert npc.blackboard.get("state") == "friendly"
    world.move_player("p", (30, 0))
    run_frames(world, 3)
    assert npc.blackboard.get("state") == "idle" and npc.tree.asleep
    while world.time < 10.2:
        world.update(0.1)
    world.move_player("p", (1, 0))
    run_frames(world, 3)
    assert npc.blackboard.get("state") == "friendly"


def test_an_engine_that_refuses_a_request_costs_a_line_not_the_world(gated: Any) -> None:
    def refuse(npc: str, state: str, **kwargs: Any) -> Any:
        raise ValueError("slot value refused")

    gated.submit = refuse
    world = World(gated, seed=14)
    world.add_npc("n", "farmer", SIMPLE, position=(0, 0))
    world.add_player("p", "Aria", (1, 0))
    events = run_frames(world, 4)
    assert [(e.reason, e.npc_id) for e in events if isinstance(e, LineDropped)] == [("error", "n")]
    assert lines(events) == [] and world.stats()["dropped_error"] == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"speech_cooldown": math.nan}, "speech_cooldown"),
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"deadline_ms": -5}, "deadline_ms"),
        ({"tick_rate_hz": 0}, "tick_rate_hz"),
        ({"state_map": {"dancing": "partying"}}, "state_map maps 'dancing'"),
        ({"cell_size": math.inf}, "cell_size"),
    ],
)
def test_bad_world_options_raise(generator: Any, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        World(generator, **options)
