"""The guard demo and the example trees, ticked as short narratives with a fake clock."""

from __future__ import annotations

import io
from typing import Any

import pytest

from behavior_tree import Factory, Status, Tree
from behavior_tree.demo import (
    GUARD_START,
    example_path,
    guard_scenario,
    register_generic_nodes,
    run_demo,
)


class Game:
    """One NPC tree with the generic demo nodes, a fake clock and a log of what it did."""

    def __init__(self, example: str, start: dict[str, Any]) -> None:
        self.now = 0.0
        self.actions: list[str] = []
        self.changes: list[tuple[str, Any, Any]] = []
        factory = register_generic_nodes(Factory(), lambda node, anim: self.actions.append(anim))
        self.tree: Tree = factory.load_file(example_path(example)).instantiate(
            clock=lambda: self.now
        )
        for key, value in start.items():
            self.tree.blackboard.set(key, value)
        self.tree.blackboard.observe(lambda k, old, new: self.changes.append((k, old, new)))

    def tick(self, seconds: float = 10.0, **changes: Any) -> Status:
        self.now += seconds
        for key, value in changes.items():
            self.tree.blackboard.set(key, value)
        self.actions.clear()
        status = self.tree.tick()
        assert not self.tree.errors, self.tree.errors
        return status

    def __getitem__(self, key: str) -> Any:
        return self.tree.blackboard.get(key)




# --------------------------------------------------------------------------- run_demo


def demo_text(seed: int = 0, ticks: int = 12) -> str:
    out = io.StringIO()
    assert run_demo(seed=seed, ticks=ticks, out=out) == 0
    return out.getvalue()


def test_demo_tells_the_evening_and_ends_with_a_coloured_mermaid_tree() -> None:
    text = demo_text()
    assert "night falls" in text
    assert "state: 'patrolling' -> 'alert'" in text
    assert "alarms: 0 -> 1" in text
    assert "does: blow_horn, draw_sword" in text
    assert "state: 'patrolling' -> 'resting'" in text
    assert "trace: " in text and "=> guard RUNNING" in text
    assert "error:" not in text
    mermaid = text[text.index("flowchart TD") :]
    assert 'n0[["guard<br/>(ReactiveFallback)"]]' in mermaid
    assert "classDef running" in mermaid and "classDef failure" in mermaid


def test_demo_is_deterministic_for_a_seed_and_the_seed_changes_the_story() -> None:
    assert demo_text(seed=1) == demo_text(seed=1)
    assert demo_text(seed=0) != demo_text(seed=1)


def test_demo_does_not_tick_the_guard_while_it_sleeps() -> None:
    lines = demo_text().splitlines()
    assert "    sleeps until t=40s, or until a key it read changes" in lines
    asleep = lines.index("    asleep: not ticked")
    assert lines[asleep - 1].startswith("tick  3")


def test_demo_prints_one_block_per_tick() -> None:
    text = demo_text(ticks=5)
    assert [line.split()[1] for line in text.splitlines() if line.startswith("tick ")] == [
        "1", "2", "3", "4", "5",
    ]  # fmt: skip


def test_demo_rejects_a_tick_count_below_one() -> None:
    with pytest.raises(ValueError, match="ticks must be at least 1"):
        run_demo(ticks=0, out=io.StringIO())


@pytest.mark.parametrize("seed", range(8))
def test_scenario_beats_come_in_order_and_fit_in_the_ticks(seed: int) -> None:
    events = guard_scenario(seed, 12)
    ticks = [event.tick for event in events]
    assert ticks == sorted(set(ticks))
    assert ticks[0] >= 2 and ticks[-1] <= 11
    assert [next(iter(e.changes)) for e in events] == [
        "player_near", "is_night", "player_near", "hostile_near", "hostile_near", "on_duty",
    ]  # fmt: skip


# --------------------------------------------------------------------------- guard.xml


def test_guard_patrols_the_route_and_ignores_a_player_by_day() -> None:
    game = Game("guard.xml", GUARD_START)
    assert game.tick() is Status.RUNNING
    assert game["state"] == "patrolling"
    assert game.tree.find("walk").status is Status.RUNNING
    game.tick()  # still walking (30 s)
    game.tick(player_near=True)
    assert game["state"] == "patrolling"  # a player by day is no threat
    assert game.tree.find("walk").status is Status.RUNNING
    game.tick()
    assert game["location"] == "gate"
    assert game.actions == ["look_around"]
    assert game.tick() is Status.SUCCESS  # pause done: one round of the patrol loop
    for _ in range(4):
        game.tick()
    assert game["location"] == "market"  # the next waypoint on the route


def test_guard_turns_alert_at_night_and_the_horn_respects_its_cooldown() -> None:
    game = Game("guard.xml", GUARD_START)
    game.tick(player_near=True)
    assert game.tree.find("walk").status is Status.RUNNING
    assert game.tick(is_night=True) is Status.SUCCESS
    assert game["state"] == "alert"
    assert game.actions == ["blow_horn", "draw_sword"]
    assert game["alarms"] == 1
    assert game.tree.find("walk").status is Status.IDLE  # the patrol was halted
    game.tick()
    assert game.actions == ["draw_sword"]  # horn cooling down (30 s)
    game.tick(player_near=False)
    assert game["state"] == "patrolling"
    game.tick(hostile_near=True)  # 30 s after the first horn
    assert game.actions == ["blow_horn", "draw_sword"]
    assert game["alarms"] == 2


def test_guard_walks_to_the_barracks_and_rests_off_duty() -> None:
    game = Game("guard.xml", {**GUARD_START, "location": "gate"})
    game.tick()
    game.tick(on_duty=False)
    assert game["state"] == "resting"
    assert game.tree.find("to barracks").status is Status.RUNNING
    game.tick(seconds=15)
    assert game["location"] == "barracks"
    assert game.actions == ["sit"]
    assert game.tree.find("rest a while").status is Status.RUNNING


def test_guard_rest_is_interrupted_by_a_player_at_night() -> None:
    game = Game("guard.xml", {**GUARD_START, "on_duty": False, "is_night": True})
    game.tick()
    assert game["state"] == "resting"
    game.tick(player_near=True)
    assert game["state"] == "alert"
    assert game.tree.find("rest a while").status is Status.IDLE


# --------------------------------------------------------------------------- merchant.xml


MERCHANT_START = {
    "hostile_near": False,
    "player_near": False,
    "is_night": False,
    "stock": 3,
    "crates": 1,
    "state": "idle",
    "location": "stall",
}


def test_merchant_restocks_when_low_then_trades_and_waves_at_customers() -> None:
    game = Game("merchant.xml", MERCHANT_START)
    game.tick()
    assert game["state"] == "restocking"
    game.tick()  # 15 s to the storeroom
    assert game["location"] == "stall"
    game.tick()
    assert (game["location"], game["stock"], game["crates"]) == ("storeroom", 23, 0)
    game.tick()
    game.tick()  # and 15 s back
    assert game["location"] == "stall"
    game.tick(player_near=True)
    assert game["state"] == "trading"
    assert game.actions == ["wave"]


def test_merchant_flees_from_danger_and_closes_at_night() -> None:
    game = Game("merchant.xml", {**MERCHANT_START, "stock": 10})
    game.tick()
    assert game["state"] == "trading"
    game.tick(hostile_near=True)
    assert game["state"] == "fleeing"
    game.tick()
    assert game["location"] == "home"
    assert game.actions == ["cower"]
    game.tick(hostile_near=False, is_night=True)
    assert game["state"] == "sleeping"  # already home: no packing, no walk
    assert game.tree.find("sleep").status is Status.RUNNING


# --------------------------------------------------------------------------- innkeeper.xml


INN_START = {
    "brawl": False,
    "is_night": False,
    "orders": 1,
    "guests": 2,
    "served": 0,
    "state": "idle",
    "location": "bar",
}


def test_innkeeper_opens_once_serves_orders_and_tidies_up() -> None:
    game = Game("innkeeper.xml", INN_START)
    game.tick()
    assert game.actions == ["unlock_door"]
    assert game["state"] == "serving"
    game.tick()
    assert game.actions == ["pour_ale"]  # one mug per tick: Repeat hands back control
    game.tick()
    assert game.actions == ["pour_ale"]
    game.tick()
    assert (game["orders"], game["served"]) == (0, 1)
    game.tick()
    assert game["state"] == "tidying"
    assert "unlock_door" not in game.actions  # RunOnce
    assert game.actions == ["wipe_counter", "hum"]


def test_innkeeper_stops_a_brawl_at_once_and_locks_up_at_night() -> None:
    game = Game("innkeeper.xml", {**INN_START, "orders": 0})
    game.tick()
    assert game["state"] == "tidying"
    game.tick(brawl=True)
    assert game["state"] == "stopping_brawl"
    assert game.actions == ["bang_counter"]
    assert game.tree.find("wait for guests").status is Status.IDLE  # halted
    game.tick(brawl=False, is_night=True, guests=0)
    assert game["state"] == "closed"
    game.tick()
    assert game.actions == ["lock_door"]


# --------------------------------------------------------------------------- generic nodes


def test_next_waypoint_wraps_around_the_route() -> None:
    xml = """<root BTCPP_format="4"><BehaviorTree ID="T">
      <NextWaypoint route="a; b" index="{i}" waypoint="{w}"/>
    </BehaviorTree></root>"""
    tree = register_generic_nodes(Factory()).create_tree(xml)
    seen = []
    for _ in range(3):
        tree.tick()
        seen.append(tree.blackboard.get("w"))
    assert seen == ["a", "b", "a"]


def test_move_to_runs_for_its_time_and_asks_the_tree_to_sleep() -> None:
    now = [0.0]
    xml = """<root BTCPP_format="4"><BehaviorTree ID="T">
      <MoveTo goal="well" seconds="3" location="{at}"/>
    </BehaviorTree></root>"""
    tree = register_generic_nodes(Factory()).load(xml).instantiate(clock=lambda: now[0])
    assert tree.tick() is Status.RUNNING
    assert tree.asleep and tree.wake_deadline == 3.0
    now[0] = 3.0
    assert tree.tick() is Status.SUCCESS
    assert tree.blackboard.get("at") == "well"


@pytest.mark.parametrize("example", ["guard.xml", "merchant.xml", "innkeeper.xml"])
def test_example_trees_survive_an_xml_round_trip(example: str) -> None:
    factory = register_generic_nodes(Factory())
    definition = factory.load_file(example_path(example))
    again = factory.load(definition.to_xml(), filename="round-trip.xml")
    assert again == definition
    assert set(again.models) >= {"MoveTo", "PlayAnimation"}
