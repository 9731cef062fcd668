"""What the server needs from a world, and a behavior-tree world that provides it.

:class:`SyncWorld` is the narrow interface the server core drives: it ticks the world,
reads NPC positions and *synced* state (the blackboard keys clients replicate), is told
about every synced change and NPC move, and applies player intents. :class:`TreeWorld`
implements it over ``behavior_tree`` (one :class:`~behavior_tree.Tree` per NPC, ticked
by a :class:`~behavior_tree.TreeScheduler` on the world's own clock, so sleeping NPCs
cost nothing). :func:`sim_world` builds the seeded village the load test uses.

The server world never generates lines: that happens client-side.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Protocol

from behavior_tree import Factory, Tree, TreeScheduler

__all__ = ["TALK_INTENTS", "NpcMoveObserver", "StateObserver", "SyncWorld", "TreeWorld",
           "sim_world"]

#: the dialogue intents of the shipped model's catalog (``runtime.LineGenerator.catalog()``;
#: a test keeps them equal): what a ``talk`` may name in a world without its own catalog
TALK_INTENTS = ("approach", "greet", "ask_directions", "ask_rumors", "trade", "threaten",
                "farewell")

Pos = tuple[float, float]
StateObserver = Callable[[str, str, Any, Any], None]  # (npc_id, key, old, new)
NpcMoveObserver = Callable[[str, Pos], None]  # (npc_id, new position)


class SyncWorld(Protocol):
    """The world as the sync server sees it."""

    def step(self, dt: float) -> None:
        """Advance world time by ``dt`` seconds and tick the NPCs that are due."""

    def npc_ids(self) -> Iterable[str]: ...

    def npc_position(self, npc_id: str) -> Pos: ...

    def npc_state(self, npc_id: str) -> dict[str, Any]:
        """The synced keys of ``npc_id`` (a fresh dict of scalars)."""

    def observe(self, on_state: StateObserver, on_move: NpcMoveObserver) -> None:
        """Call ``on_state`` after every synced-key change and ``on_move`` after an NPC moves."""

    def set_player(self, player_id: str, position: Pos) -> None:
        """Add the player or move it."""

    def remove_player(self, player_id: str) -> None: ...

    def talk(self, npc_id: str, player_id: str, intent: str) -> None:
        """Apply a player's dialogue choice (state changes only; no line generation)."""

    def intents(self) -> Collection[str]:
        """The dialogue intents a ``talk`` may name (the catalog)."""

    def apply_state(self, npc_id: str, key: str, value: Any) -> None:
        """Set a synced key directly (journal replay after a restart); key ``"@pos"``
        moves the NPC to ``value`` = [x, y]."""

    def save(self) -> dict[str, Any]:
        """A JSON-compatible copy of the whole world."""

    def load(self, data: Mapping[str, Any]) -> None:
        """Restore :meth:`save` output into a world built from the same definitions."""


class _Npc:
    __slots__ = ("id", "pos", "tree")

    def __init__(self, npc_id: str, pos: Pos, tree: Tree) -> None:
        self.id = npc_id
        self.pos = pos
        self.tree = tree


class TreeWorld:
    """NPCs driven by behavior trees; ``synced_keys`` of each root blackboard replicate.

    ``talk(npc, player, intent)`` writes ``talking_to`` and ``last_intent`` on the NPC's
    blackboard (so trees can react, and clients see it when those keys are synced);
    ``intents`` is the catalog a talk may name.
    """

    def __init__(self, *, synced_keys: Iterable[str] = ("state",), rate_hz: float = 10.0,
                 seed: int = 0, intents: Iterable[str] = TALK_INTENTS) -> None:
        self.synced_keys = frozenset(synced_keys)
        self._intents = frozenset(intents)
        self.time = 0.0
        self.scheduler = TreeScheduler(rate_hz=rate_hz, seed=seed)
        self.npcs: dict[str, _Npc] = {}
        self.players: dict[str, Pos] = {}
        self._on_state: list[StateObserver] = []
        self._on_move: list[NpcMoveObserver] = []

    def clock(self) -> float:
        return self.time

    # ---- building ------------------------------------------------------------------------
    def add_npc(self, npc_id: str, tree: Tree, position: Pos) -> None:
        """Add an NPC; ``tree`` must use :meth:`clock` as its clock (see :func:`sim_world`)."""
        if npc_id in self.npcs:
            raise ValueError(f"NPC {npc_id!r} already exists")
        npc = _Npc(npc_id, (float(position[0]), float(position[1])), tree)
        self.npcs[npc_id] = npc
        synced, observers = self.synced_keys, self._on_state

        def changed(key: str, old: Any, new: Any) -> None:
            if key in synced:
                for cb in observers:
                    cb(npc_id, key, old, new)

        tree.blackboard.observe(changed)
        self.scheduler.add(tree, start=self.time)

    def move_npc(self, npc_id: str, position: Pos) -> None:
        npc = self.npcs[npc_id]
        npc.pos = (float(position[0]), float(position[1]))
        for cb in self._on_move:
            cb(npc_id, npc.pos)

    # ---- SyncWorld -----------------------------------------------------------------------
    def step(self, dt: float) -> None:
        self.time += dt
        self.scheduler.update(self.time)

    def npc_ids(self) -> Iterable[str]:
        return self.npcs.keys()

    def npc_position(self, npc_id: str) -> Pos:
        return self.npcs[npc_id].pos

    def npc_state(self, npc_id: str) -> dict[str, Any]:
        bb = self.npcs[npc_id].tree.blackboard
        return {k: bb.get(k) for k in self.synced_keys if k in bb}

    def observe(self, on_state: StateObserver, on_move: NpcMoveObserver) -> None:
        self._on_state.append(on_state)
        self._on_move.append(on_move)

    def set_player(self, player_id: str, position: Pos) -> None:
        self.players[player_id] = (float(position[0]), float(position[1]))

    def remove_player(self, player_id: str) -> None:
        self.players.pop(player_id, None)

    def talk(self, npc_id: str, player_id: str, intent: str) -> None:
        npc = self.npcs.get(npc_id)
        if npc is None:
            return  # the NPC left the world since the client saw it: nothing to apply
        bb = npc.tree.blackboard
        bb.set("talking_to", player_id)
        bb.set("last_intent", intent)

    def intents(self) -> Collection[str]:
        return self._intents

    def apply_state(self, npc_id: str, key: str, value: Any) -> None:
        npc = self.npcs.get(npc_id)
        if npc is None:
            return
        if key == "@pos":
            self.move_npc(npc_id, (value[0], value[1]))
        else:
            npc.tree.blackboard.set(key, value)

    def save(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "npcs": {i: {"pos": list(n.pos), "tree": n.tree.snapshot()}
                     for i, n in self.npcs.items()},
            "players": {p: list(pos) for p, pos in self.players.items()},
        }

    def load(self, data: Mapping[str, Any]) -> None:
        self.time = float(data["time"])
        for i, entry in data["npcs"].items():
            npc = self.npcs.get(i)
            if npc is None:
                raise ValueError(f"saved world has NPC {i!r}, this world does not")
            npc.pos = (float(entry["pos"][0]), float(entry["pos"][1]))
            npc.tree.restore(entry["tree"])
            npc.tree.wake()
        self.players = {p: (float(v[0]), float(v[1])) for p, v in data["players"].items()}


# ---- the load-test village ---------------------------------------------------------------

VILLAGER_XML = """
<root BTCPP_format="4" main_tree_to_execute="Villager">
  <BehaviorTree ID="Villager">
    <Sequence name="day">
      <Script name="work" code="state := 'working'"/>
      <Sleep name="work a while" msec="{period_ms}"/>
      <Script name="rest" code="state := 'idle'"/>
      <Sleep name="rest a while" msec="{period_ms}"/>
    </Sequence>
  </BehaviorTree>
</root>
"""


def sim_world(npcs: int = 200, *, size: float = 1000.0, changes_per_s: float = 100.0,
              seed: int = 0, rate_hz: float = 10.0) -> TreeWorld:
    """A seeded village of ``npcs`` villagers scattered over a ``size`` x ``size`` map.

    Each villager alternates 'working'/'idle', holding each state for
    ``npcs / changes_per_s`` seconds (+-20 %), so the world changes about
    ``changes_per_s`` synced keys per second in total. Synced keys: state, talking_to,
    last_intent.
    """
    if npcs < 1 or changes_per_s <= 0 or size <= 0:
        raise ValueError("sim_world needs npcs >= 1, changes_per_s > 0 and size > 0")
    rng = random.Random(seed)
    world = TreeWorld(synced_keys=("state", "talking_to", "last_intent"), rate_hz=rate_hz,
                      seed=seed)
    definition = Factory().load(VILLAGER_XML)
    hold_ms = 1000.0 * npcs / changes_per_s
    for k in range(npcs):
        tree = definition.instantiate(None, clock=world.clock)
        bb = tree.blackboard
        bb.set("period_ms", hold_ms * rng.uniform(0.8, 1.2))
        bb.set("talking_to", "")
        bb.set("last_intent", "")
        world.add_npc(f"npc{k}", tree, (rng.uniform(0, size), rng.uniform(0, size)))
    return world
