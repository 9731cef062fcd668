"""The Redis keys of one world, and the areas the map is cut into.

Every key of a world starts with ``{PREFIX}:``; the braces make it a Redis Cluster hash tag,
so one world's keys share one slot (a script may touch any of them) and several worlds can
be spread over the shards of a Redis Cluster. Keys:

=====================  ======  ============================================================
``lease:AREA``         string  the node that owns AREA; expires (``PX``) unless renewed
``fence:AREA``         string  AREA's fencing token, incremented by each takeover
``changes``            stream  every tick's published changes: ``n`` node, ``d`` JSON
``intents:AREA``       stream  intents for AREA's NPCs from nodes that do not own it
``consumed``           hash    AREA -> the last ``intents:AREA`` entry its owner applied
``checkpoints``        hash    AREA -> JSON {fence, npcs: {id: {pos, tree}}}
``checkpoint_ids``     hash    AREA -> the ``changes`` entry its checkpoint includes
``cseq``               hash    player -> the highest intent seq applied (deduplication)
``player_pos``         hash    player -> "x,y", where the player is durably
``player_node``        hash    player -> the node whose client the player last was
``sessions``           hash    player -> ``"GEN NODE"``: the one session that serves the
                               player (GEN goes up with every hello on any node)
``handoffs``           stream  ``p`` player, ``s`` the session a hello on another node
                               replaced (its node ends it at its next poll)
``nodes``              zset    node -> its last heartbeat (Redis time, ms)
``meta``               hash    ``world``: the world fingerprint every node must share
=====================  ======  ============================================================
"""

from __future__ import annotations

import math

__all__ = ["Keys", "area_of", "as_str"]


def area_of(pos: tuple[float, float], size: float) -> str:
    """The area holding ``pos``: ``"IX:IY"``, the indices of its ``size`` x ``size`` cell."""
    return f"{math.floor(pos[0] / size)}:{math.floor(pos[1] / size)}"


class Keys:
    """Key names of the world ``prefix`` (see the module docstring)."""

    def __init__(self, prefix: str = "flashnpc") -> None:
        if not prefix or any(c in prefix for c in "{}: \t\n"):
            raise ValueError(f"world prefix {prefix!r}: use letters, digits, '-' or '_'")
        self.prefix = prefix
        base = f"{{{prefix}}}:"
        self.base = base
        self.changes = base + "changes"
        self.consumed = base + "consumed"
        self.checkpoints = base + "checkpoints"
        self.checkpoint_ids = base + "checkpoint_ids"
        self.cseq = base + "cseq"
        self.player_pos = base + "player_pos"
        self.player_node = base + "player_node"
        self.sessions = base + "sessions"
        self.handoffs = base + "handoffs"
        self.nodes = base + "nodes"
        self.meta = base + "meta"

    def lease(self, area: str) -> str:
        return f"{self.base}lease:{area}"

    def fence(self, area: str) -> str:
        return f"{self.base}fence:{area}"

    def intents(self, area: str) -> str:
        return f"{self.base}intents:{area}"


def as_str(v: object) -> str:
    """A Redis reply item as str (bytes are UTF-8)."""
    return v.decode() if isinstance(v, bytes) else str(v)
