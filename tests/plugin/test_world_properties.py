"""Random game scripts against a World: no call the script makes legally ever raises, the
in-flight cap holds, and no delivered line is stale (its state is the NPC's state when it
arrives)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugin import Line, World
from tests.plugin.conftest import GatedGenerator

MOODY = """
<root BTCPP_format="4">
  <BehaviorTree ID="Moody">
    <ReactiveFallback>
      <Script _skipIf="!hostile_near" code="state := 'flee'"/>
      <Script _skipIf="last_intent != 'threaten'" code="state := 'combat'"/>
      <Script _skipIf="!player_near" code="state := 'friendly'"/>
      <Sequence>
        <Script code="state := is_night ? 'rest' : 'working'"/>
        <Sleep msec="3000"/>
      </Sequence>
    </ReactiveFallback>
  </BehaviorTree>
</root>
"""


@pytest.fixture(scope="module")
def shared_generator(plugin_model_dir: Any) -> Any:
    from runtime.client.generator import LineGenerator

    with LineGenerator.load(plugin_model_dir) as gen:
        yield gen


ARCHETYPES = ["guard", "merchant", "farmer", "child"]
INTENTS = ["greet", "ask_rumors", "trade", "threaten", "farewell"]


def play(world: World, gated: Any, rng: random.Random, steps: int) -> list[Line]:
    delivered: list[Line] = []
    next_id = 0
    for _ in range(steps):
        op = rng.random()
        npcs, players = list(world.npcs), list(world.players)
        if op < 0.12 or not npcs:
            next_id += 1
            world.add_npc(f"n{next_id}", rng.choice(ARCHETYPES), MOODY,
                          position=(rng.uniform(0, 20), rng.uniform(0, 20)), radius=rng.uniform(1, 6))
        elif op < 0.18:
            world.remove_npc(rng.choice(npcs))
        elif op < 0.26 or not players:
            next_id += 1
            world.add_player(f"p{next_id}", f"P{next_id}", (rng.uniform(0, 20), rng.uniform(0, 20)),
                             reputation=rng.choice(["friendly", "unknown", "hostile"]))
        elif op < 0.30:
            world.remove_player(rng.choice(players))
        elif op < 0.55:
            world.move_player(rng.choice(players), (rng.uniform(0, 20), rng.uniform(0, 20)))
        elif op < 0.62:
            world.talk(rng.choice(npcs), rng.choice(players), rng.choice(INTENTS))
        elif op < 0.66:
            world.set_context(time_of_day=rng.choice(["day", "night", "dusk"]))
        elif op < 0.72:
            world.npcs[rng.choice(npcs)].blackboard.set("state", rng.choice(["alert", "idle", "patrol"]))
        elif op < 0.80 and gated.pending:
            gated.release()
        events = world.update(rng.choice([0.0, 0.05, 0.1, 0.3]))
        for e in events:
            if isinstance(e, Line):
                delivered.append(e)
                if e.npc_id in world.npcs:
                    assert world.npc_state(e.npc_id) == e.state, e
        assert world.stats()["in_flight"] <= world.max_in_flight
        assert len(world.grid) == len(world.npcs) == len(world.scheduler)
    return delivered


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_random_scripts_keep_the_worlds_promises(shared_generator: Any, seed: int) -> None:
    gated = GatedGenerator(shared_generator)
    world = World(gated, seed=seed, max_in_flight=3, speech_cooldown=1.0)
    rng = random.Random(seed)
    play(world, gated, rng, 120)
    for _ in range(40):  # the engine answers everything: the world empties its queue
        gated.release()
        for e in world.update(0.1):
            if isinstance(e, Line) and e.npc_id in world.npcs:
                assert world.npc_state(e.npc_id) == e.state
        if not world.stats()["in_flight"] and not world.stats()["queued"]:
            break
    assert world.stats()["in_flight"] == 0 and world.stats()["queued"] == 0


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_random_scripts_in_deterministic_mode_deliver_only_current_lines(shared_generator: Any,
                                                                        seed: int) -> None:
    class Synchronous:  # deterministic mode generates in update: nothing is ever pending
        def __init__(self) -> None:
            self.pending: list[Any] = []

        def release(self) -> None:
            pass

    world = World(shared_generator, seed=seed, deterministic=True, max_in_flight=3, speech_cooldown=1.0)
    play(world, Synchronous(), random.Random(seed), 80)
