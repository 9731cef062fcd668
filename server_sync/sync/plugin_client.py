"""Run a local :class:`plugin.World` in client mode: NPC state from the server, lines local.

    world = World(mode="client")            # the bundled model generates lines here
    build_village(world)                    # the same NPC ids as the server's world
    client = Client(url, token, position=(0, 0))
    mirror = WorldMirror(client, world)     # state is mirrored from the server
    asyncio.create_task(client.run())
    while running:
        world.move_player(me, pos); await client.send_intent(pos=pos)
        for event in world.update(dt): ...  # Line events, generated on this machine

The mirror uses the world's public client mode only: it makes every NPC of the world remote
(:meth:`plugin.World.set_remote`; a world created with ``mode="client"`` already is), so the
local trees never tick, and writes every synced key the server sends (snapshot, enter, set)
with :meth:`plugin.World.apply_remote_state`, and NPC moves with ``move_npc``. The world's own
machinery (``StateChanged`` events, proximity barks, the stale-line policy) then runs on the
server's state. NPCs the server knows but the local world does not are counted in
``unknown_npcs`` and skipped; keys the local world writes itself (``plugin.world.WORLD_KEYS``, such
as ``player_near``) are collected in ``skipped_keys`` and not applied; a value the NPC's
blackboard refuses (a type clash between server and client trees) is logged and counted in
``rejected`` instead of breaking the connection.
"""

from __future__ import annotations

import logging
from typing import Any

from .client import Client
from .replica import Change

__all__ = ["WorldMirror"]

log = logging.getLogger("flashnpc.sync.mirror")


class WorldMirror:
    """Feeds ``client``'s replica into ``world`` (a ``plugin.World``); see the module doc."""

    def __init__(self, client: Client, world: Any) -> None:
        from plugin.world import WORLD_KEYS

        self.client = client
        self.world = world
        self.unknown_npcs: set[str] = set()
        self.skipped_keys: set[str] = set()
        self.rejected = 0
        self._world_keys = WORLD_KEYS
        self._ids = {str(n): n for n in world.npcs}
        for nid in world.npcs:  # the server is authoritative: local trees must not tick and diverge
            world.set_remote(nid)
        previous = client.on_change

        def on_change(ch: Change) -> None:
            self.apply(ch)
            if previous is not None:
                previous(ch)

        client.on_change = on_change

    def apply(self, ch: Change) -> None:
        """Apply one replica change to the local world."""
        if ch.kind == "reset":
            return
        nid = self._ids.get(ch.npc_id)
        if nid is None:
            self.unknown_npcs.add(ch.npc_id)
            return
        if ch.kind == "enter":
            entry = self.client.replica.npcs[ch.npc_id]
            for key, value in entry["state"].items():
                self._set(nid, key, value)
            self.world.move_npc(nid, entry["pos"])
        elif ch.kind == "set" and ch.key is not None:
            self._set(nid, ch.key, ch.new)
        elif ch.kind == "move":
            self.world.move_npc(nid, ch.new)

    def _set(self, nid: Any, key: str, value: Any) -> None:
        from plugin.errors import WorldError

        if key in self._world_keys:
            self.skipped_keys.add(key)
            return
        try:
            self.world.apply_remote_state(nid, key, value)
        except WorldError:
            self.rejected += 1
            log.warning("server state for NPC %r not applied", nid, exc_info=True)
