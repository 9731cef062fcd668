"""Run a local :class:`plugin.World` in client mode: NPC state from the server, lines local.

    world = World()                         # the bundled model generates lines here
    build_village(world)                    # the same NPC ids as the server's world
    client = Client(url, token, position=(0, 0))
    mirror = WorldMirror(client, world)     # trees stop ticking locally; state is mirrored
    asyncio.create_task(client.run())
    while running:
        world.move_player(me, pos); await client.send_intent(pos=pos)
        for event in world.update(dt): ...  # Line events, generated on this machine

The mirror writes every synced key the server sends (snapshot, enter, set) into the local
NPC's blackboard and applies NPC moves, so the world's own machinery (``StateChanged``
events, proximity barks, the stale-line policy) runs on the server's state. NPCs the server
knows but the local world does not are counted in ``unknown_npcs`` and skipped.
"""

from __future__ import annotations

from typing import Any

from .client import Client
from .replica import Change

__all__ = ["WorldMirror"]


class WorldMirror:
    """Feeds ``client``'s replica into ``world`` (a ``plugin.World``); see the module doc."""

    def __init__(self, client: Client, world: Any) -> None:
        self.client = client
        self.world = world
        self.unknown_npcs: set[str] = set()
        self._ids = {str(n): n for n in world.npcs}
        # the server is authoritative: local trees must not tick and diverge
        for npc in world.npcs.values():
            if npc.tree in world.scheduler:
                world.scheduler.remove(npc.tree)
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
        npc = self.world.npcs[nid]
        if ch.kind == "enter":
            entry = self.client.replica.npcs[ch.npc_id]
            for key, value in entry["state"].items():
                npc.blackboard.set(key, value)
            self.world.move_npc(nid, entry["pos"])
        elif ch.kind == "set" and ch.key is not None:
            npc.blackboard.set(ch.key, ch.new)
        elif ch.kind == "move":
            self.world.move_npc(nid, ch.new)
