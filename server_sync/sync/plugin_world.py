"""Serve a :class:`plugin.World` with the sync server (the ``SyncWorld`` adapter).

The server-side world runs NPC trees only, because lines are generated client-side
(:class:`server_sync.sync.plugin_client.WorldMirror`): :func:`village_world` builds it on
:meth:`runtime.LineGenerator.fallback_only` (no model is loaded, no model math runs) with
approach barks off (``World(approach_barks=False)``), so players walking around request no
lines. A ``talk`` intent still goes through :meth:`plugin.World.talk`, so the NPC's tree
sees ``last_intent``; its reply is an authored fallback nobody receives.

Synced keys: by default every key the world reports as :class:`plugin.StateChanged`
(tree-written, non-private, not one of the world's own input keys) whose value is a
scalar; pass ``synced_keys`` to restrict them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from .world import NpcMoveObserver, Pos, StateObserver

__all__ = ["PluginWorld", "village_world"]

_SCALARS = (str, int, float, bool, type(None))


class PluginWorld:
    """:class:`~server_sync.sync.world.SyncWorld` over a ``plugin.World`` (NPC ids become str)."""

    def __init__(self, world: Any, *, synced_keys: Iterable[str] | None = None) -> None:
        from plugin.events import StateChanged
        from plugin.world import WORLD_KEYS

        self.world = world
        self.synced_keys = None if synced_keys is None else frozenset(synced_keys)
        self._hidden = WORLD_KEYS
        self._ids: dict[str, Any] = {str(n): n for n in world.npcs}
        self._on_state: list[StateObserver] = []
        self._on_move: list[NpcMoveObserver] = []
        self.talk_errors = 0
        world.on(StateChanged, self._changed)

    def _synced(self, key: str, value: Any) -> bool:
        if self.synced_keys is not None:
            return key in self.synced_keys
        return not key.startswith("_") and key not in self._hidden and isinstance(value, _SCALARS)

    def _changed(self, ev: Any) -> None:
        if self._synced(ev.key, ev.new):
            nid = str(ev.npc_id)
            for cb in self._on_state:
                cb(nid, ev.key, ev.old, ev.new)

    # ---- SyncWorld -----------------------------------------------------------------------
    def step(self, dt: float) -> None:
        self.world.update(dt)

    def npc_ids(self) -> Iterable[str]:
        return self._ids.keys()

    def npc_position(self, npc_id: str) -> Pos:
        return self.world.npcs[self._ids[npc_id]].position

    def npc_state(self, npc_id: str) -> dict[str, Any]:
        bb = self.world.npcs[self._ids[npc_id]].tree.blackboard
        return {k: v for k, v in bb.items() if self._synced(k, v)}

    def observe(self, on_state: StateObserver, on_move: NpcMoveObserver) -> None:
        self._on_state.append(on_state)
        self._on_move.append(on_move)

    def move_npc(self, npc_id: str, position: Pos) -> None:
        self.world.move_npc(self._ids[npc_id], position)
        pos = self.world.npcs[self._ids[npc_id]].position
        for cb in self._on_move:
            cb(npc_id, pos)

    def set_player(self, player_id: str, position: Pos) -> None:
        if player_id in self.world.players:
            self.world.move_player(player_id, position)
        else:
            self.world.add_player(player_id, player_id, position)

    def remove_player(self, player_id: str) -> None:
        if player_id in self.world.players:
            self.world.remove_player(player_id)

    def talk(self, npc_id: str, player_id: str, intent: str) -> None:
        from plugin.errors import WorldError

        npc = self._ids.get(npc_id)
        if npc is None or player_id not in self.world.players:
            self.talk_errors += 1
            return
        try:
            self.world.talk(npc, player_id, intent)
        except WorldError:
            self.talk_errors += 1  # e.g. an intent outside the model's catalog

    def intents(self) -> Collection[str]:
        return self.world.catalog["intents"]

    def apply_state(self, npc_id: str, key: str, value: Any) -> None:
        if npc_id not in self._ids:
            return
        if key == "@pos":
            self.move_npc(npc_id, (value[0], value[1]))
        else:
            self.world.npcs[self._ids[npc_id]].tree.blackboard.set(key, value)

    @property
    def players(self) -> dict[str, Pos]:
        return {str(p): pl.position for p, pl in self.world.players.items()}

    def save(self) -> dict[str, Any]:
        w = self.world
        return {"time": w.time,
                "npcs": {i: {"pos": list(w.npcs[n].position), "tree": w.npcs[n].tree.snapshot()}
                         for i, n in self._ids.items()},
                "players": {str(p): list(pl.position) for p, pl in w.players.items()}}

    def load(self, data: Mapping[str, Any]) -> None:
        w = self.world
        w.time = float(data["time"])
        for i, entry in data["npcs"].items():
            if i not in self._ids:
                raise ValueError(f"saved world has NPC {i!r}, this world does not")
            n = self._ids[i]
            w.move_npc(n, entry["pos"])
            w.npcs[n].tree.restore(entry["tree"])
            w.npcs[n].tree.wake()
        for p, pos in data["players"].items():
            self.set_player(p, (pos[0], pos[1]))


def village_world(path: str | Path | None = None, npcs: int = 10, *, seed: int = 0) -> PluginWorld:
    """The example village (plugin.village) on a server: trees only, no model, no barks."""
    from plugin.village import VILLAGE_DIR, build_village
    from plugin.world import World
    from runtime import LineGenerator

    if path is not None and Path(path).resolve() != VILLAGE_DIR.resolve():
        raise ValueError(f"--world {path}: only the example village ({VILLAGE_DIR}) can be "
                         "served from a directory for now; use sim:NPCS for a generated world")
    world = World(LineGenerator.fallback_only(), seed=seed, approach_barks=False)
    build_village(world, npcs)
    return PluginWorld(world)
