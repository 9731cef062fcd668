"""The durability contract of :class:`~server_sync.sync.persistence.Store`, on Redis.

:class:`RedisStore` is what :class:`~server_sync.sync.core.SyncCore` journals into on a
cluster node. The core calls :meth:`RedisStore.commit_tick` once per tick before it
acknowledges anything; here that is one fenced script (:meth:`Backplane.commit
<server_sync.cluster.backplane.Backplane.commit>`): the tick's own changes into the change
stream, intents for NPCs of other areas into those areas' intent streams, the intents it
consumed, each player's highest applied ``cseq`` and the players' positions, each
player's under the session this node holds for it. So an acknowledged intent is in Redis
with its effects, or queued for the area that applies it; a player whose session a hello on
another node replaced gets nothing written (the core ends that session, unacknowledged).
How durable Redis makes a write is Redis's ``appendfsync``: ``always`` before it replies,
``everysec`` within a second (docs/scale_out.md). :meth:`write_snapshot` checkpoints the
owned areas; :meth:`recover` is the durable view (checkpoints plus the stream after them).

Every Redis failure, and a commit refused because an area has a newer owner, raises
:class:`~server_sync.sync.persistence.StoreError` naming the cause; the core then fails
closed (refuses clients, probes once a second, reloads the durable view when Redis answers).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from ..sync.persistence import PLAYER_KEY, IntentRecord, Recovery, StoreError
from .backplane import Claim, Fenced
from .cluster_world import REDIS_ERRORS, ClusterWorld

__all__ = ["RedisStore"]

log = logging.getLogger("flashnpc.cluster")


class RedisStore:
    """The store of one node over ``world``'s Redis connection (see the module docstring).
    ``where`` names the Redis server in error messages."""

    def __init__(self, world: ClusterWorld, where: str) -> None:
        self.world = world
        self.backplane = world.backplane
        self.where = where
        self.commits_total = 0

    def _failed(self, what: str, exc: BaseException) -> StoreError:
        return StoreError(f"{what} failed (Redis {self.where}): {type(exc).__name__}: {exc}")

    def commit_tick(self, intents: Iterable[IntentRecord],
                    changes: Iterable[tuple[str, str, Any]]) -> None:
        """Write one tick in one script, or nothing (StoreError)."""
        c = self.world.take_commit()
        for r in intents:
            c.cseq[r.player] = max(c.cseq.get(r.player, 0), r.cseq)
        for pid, key, value in changes:
            if key == PLAYER_KEY:
                c.players[pid] = value
        if not c:
            return
        self.world.fence_players(c)
        try:
            _, replaced = self.backplane.commit(c)
        except Fenced as exc:
            self.world.lose([exc.area])
            raise StoreError(f"journal write refused: {exc}") from None
        except REDIS_ERRORS as exc:
            raise self._failed("journal write", exc) from None
        except ValueError as exc:  # a value JSON cannot hold
            raise StoreError(f"journal write failed: {exc}") from None
        self.world.committed(c, replaced)
        self.commits_total += 1

    def write_snapshot(self, world_state: dict[str, Any]) -> None:
        """Checkpoint every owned area (the core's snapshot; ``world_state`` is its save)."""
        try:
            self.world.checkpoint()
        except REDIS_ERRORS as exc:
            raise self._failed("checkpoint", exc) from None

    def recover(self) -> Recovery:
        """The durable view as the core's recovery: every checkpoint's NPC saves and the
        changes published after them (players come back through their hello)."""
        try:
            view = self.backplane.durable_view()
        except REDIS_ERRORS as exc:
            raise StoreError(f"cannot read the world from Redis {self.where}: "
                             f"{type(exc).__name__}: {exc}") from None
        saves, changes = self.world.reset(view)
        return Recovery({"npcs": saves}, changes)

    def claim(self, player: str) -> Claim:
        """A hello: the player's session becomes this node's; its highest applied intent
        seq and durable position (:meth:`Backplane.claim
        <server_sync.cluster.backplane.Backplane.claim>`; StoreError)."""
        try:
            return self.backplane.claim(player)
        except REDIS_ERRORS as exc:
            raise self._failed("claiming the player", exc) from None

    def close(self) -> None:
        """Hand the areas over (checkpoint and release, best effort) and disconnect."""
        try:
            self.world.release_all()
        except REDIS_ERRORS as exc:
            log.warning("node %s: could not release its areas (they expire): %s",
                        self.world.node, exc)
        self.backplane.r.close()
