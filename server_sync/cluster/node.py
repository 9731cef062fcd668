"""One cluster node: :class:`ClusterCore` and :class:`ClusterServer` over a ClusterWorld.

:func:`build_node` is what ``flashnpc serve --redis URL`` runs: it connects to Redis, wraps
the world every node builds the same in a :class:`~server_sync.cluster.cluster_world.ClusterWorld`,
checks the world's fingerprint against the other nodes', and returns a
:class:`ClusterServer` journaling into a :class:`~server_sync.cluster.store.RedisStore`.

A client may connect to any node. Each node's core has its own epoch, so a client that
resumes on another node gets a snapshot (the protocol's rule) and re-sends its
unacknowledged intents; :meth:`ClusterCore.hello` first claims the player in Redis
(:meth:`~server_sync.cluster.backplane.Backplane.claim`), which reads its highest applied
``cseq`` and durable position, so intents another node already applied are acknowledged,
not applied twice, and the player continues where it durably is.

One player, one session in the whole cluster, as on one node: the claim makes the hello's
session the player's only one. A session another node held for the player (attached, or
detached within its grace) is ended by that node the way one node ends a replaced
connection - ``error replaced`` and close 1008 ``replaced: player connected again``, the
session dropped, not kept for resume - at its next poll of the ``handoffs`` stream (every
tick), and from the claim on nothing that session sends is written: each tick's commit
checks every player's session (:class:`~server_sync.cluster.store.RedisStore`), so a
replaced session's intents are neither applied nor acknowledged, and its client (if it is
still the player's) re-sends them to the new node, which applies them once.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..sync.core import Session, SyncCore
from ..sync.persistence import StoreError
from ..sync.server import REPLACED_REASON, ServerConfig, SyncServer
from ..sync.world import TreeWorld
from ..transport.wire import PROTOCOL_VERSION, Codec, ProtocolError
from .backplane import Backplane
from .cluster_world import ClusterWorld
from .keys import Keys
from .leases import LeaseTable
from .store import RedisStore

__all__ = ["ClusterCore", "ClusterServer", "build_node", "connect_redis"]

log = logging.getLogger("flashnpc.cluster")


class ClusterCore(SyncCore):
    """:class:`~server_sync.sync.core.SyncCore` whose hellos claim the player and start from
    its durable state in Redis, and whose sessions another node's hello replaced are ended
    after each tick (module docstring); everything else is the single-node core.

    ``on_replaced(player)`` is called for each session ended so (the server closes its
    connection); :attr:`replaced_total` counts them."""

    store: RedisStore
    world: ClusterWorld

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.on_replaced: Callable[[str], None] | None = None
        self.replaced_total = 0

    def hello(self, player_id: str, msg: dict[str, Any], codec: Codec) -> Session:
        if msg["v"] == PROTOCOL_VERSION and self.unavailable is None:
            try:
                claim = self.store.claim(player_id)
            except StoreError as exc:
                raise ProtocolError("unavailable", f"the server cannot read the world now "
                                                   f"({exc}); try again later") from None
            w = self.world
            s = self.sessions.get(player_id)
            if s is not None and claim.previous != w.player_sessions.get(player_id):
                self.drop(s)  # another node served the player since: this session is stale
            w.player_sessions[player_id] = claim.session
            w.remote_players.pop(player_id, None)  # the player is this node's now
            self._cseq_floor[player_id] = max(claim.cseq, self._cseq_floor.get(player_id, 0))
            if player_id not in self.sessions and claim.pos is not None:
                w.set_player(player_id, claim.pos)  # _spawn: where the player durably is
        return super().hello(player_id, msg, codec)

    def receive(self, s: Session, msg: dict[str, Any]) -> None:
        """The core's; a message of a session this node no longer holds is ignored."""
        if self.sessions.get(s.player_id) is s:
            super().receive(s, msg)

    def drop(self, s: Session) -> None:
        """The core's, and the intents the session sent this tick are dropped with it
        (neither applied nor recorded as applied)."""
        if self.sessions.get(s.player_id) is s:
            self._intents = [(x, m) for x, m in self._intents if x is not s]
        super().drop(s)

    def tick(self, dt: float, now: float) -> list[Session]:
        """The core's tick, then every session a hello on another node replaced is ended
        (its frames of this tick, acks included, are not sent). While :attr:`frozen`
        (``/admin/freeze``) only the owned trees stop: the mirrors keep following the
        stream and the leases stay renewed, so frozen nodes converge on one world (the
        load test compares them)."""
        frozen = self.frozen
        self.world.frozen = frozen
        self.frozen = False
        try:
            out = super().tick(dt, now)
        finally:
            self.frozen = frozen
        ended = [self._end_replaced(p, v) for p, v in self.world.take_replaced().items()]
        if any(ended):
            out = [s for s in out if self.sessions.get(s.player_id) is s]
        return out

    def _end_replaced(self, player: str, session: str) -> bool:
        s = self.sessions.get(player)
        if s is None or self.world.player_sessions.get(player) != session:
            return False  # gone already, or said hello here again since
        s.outbox.clear()
        self.drop(s)
        self.replaced_total += 1
        log.info("node %s: player %s said hello on another node: its session here ended",
                 self.world.node, player)
        if self.on_replaced is not None:
            self.on_replaced(player)
        return True


class ClusterServer(SyncServer):
    """A :class:`~server_sync.sync.server.SyncServer` node of a cluster: /health adds the
    node's areas and Redis state, /metrics the ``flashnpc_cluster_*`` metrics."""

    core_class = ClusterCore

    def __init__(self, world: ClusterWorld, config: ServerConfig, store: RedisStore) -> None:
        super().__init__(world, config, store)  # type: ignore[arg-type]
        self.cluster = world
        self.core.on_replaced = self._replaced  # type: ignore[attr-defined]

    def _replaced(self, player: str) -> None:
        """Close the connection of a session another node's hello replaced, as one node
        closes a replaced connection (``error replaced``, close 1008)."""
        ws = self.conns.pop(player, None)
        if ws is not None:
            self.kick(ws.state, "replaced", REPLACED_REASON, notify=True)

    def health(self) -> dict[str, Any]:
        h = super().health()
        status = self.cluster.status()
        if status["redis_error"] is not None and self.core.unavailable is None:
            h["reasons"].append(f"Redis unreachable, nothing ticks: {status['redis_error']}")
            h["status"] = "degraded"
        status["sessions_replaced"] = self.core.replaced_total  # type: ignore[attr-defined]
        h["cluster"] = status
        return h

    def extra_metrics(self) -> Iterator[Metric]:
        w = self.cluster
        yield GaugeMetricFamily("flashnpc_cluster_areas_owned", "areas this node simulates",
                                value=len(w.owned))
        yield GaugeMetricFamily("flashnpc_cluster_remote_players",
                                "players of other nodes this node mirrors",
                                value=len(w.remote_players))
        yield GaugeMetricFamily("flashnpc_cluster_redis_available",
                                "1 while this node's last Redis round trip worked, else 0",
                                value=0 if w.error is not None else 1)
        for name, doc, value in (
            ("takeovers", "areas this node acquired", w.takeovers_total),
            ("releases", "areas this node handed to a preferred node", w.releases_total),
            ("areas_lost", "areas another node took over from this one", w.areas_lost_total),
            ("mirror_entries", "change-stream entries of other nodes applied",
             w.mirror_entries_total),
            ("mirror_reloads", "times the mirrors were reloaded from the durable view",
             w.mirror_reloads_total),
            ("intents_forwarded", "talks forwarded to the intent stream of another area",
             w.intents_forwarded_total),
            ("intents_consumed", "intents of other nodes' clients applied here",
             w.intents_consumed_total),
            ("redis_errors", "ticks whose Redis round trip failed", w.redis_errors_total),
            ("commits", "tick commits written to Redis", self.store.commits_total),  # type: ignore[union-attr]
        ):
            yield CounterMetricFamily(f"flashnpc_cluster_{name}", doc, value=value)


def connect_redis(url: str, *, timeout_s: float = 0.5) -> Any:
    """A redis-py client for ``url`` that never retries on its own (a retried script could
    run twice) and gives up after ``timeout_s``; ValueError for a malformed URL."""
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError as exc:  # an extra: single-node serving does not need it
        raise ValueError(f"--redis needs redis-py (pip install 'flashnpc[redis]'): {exc}") from exc
    try:
        return redis.Redis.from_url(url, socket_timeout=timeout_s,
                                    socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0),
                                    decode_responses=True)
    except ValueError as exc:
        raise ValueError(f"--redis {url}: {exc}") from None


def build_node(world: Any, config: ServerConfig, redis_url: str, *, node_id: str | None = None,
               area_size: float = 250.0, lease_ms: int = 2000,
               prefix: str = "flashnpc") -> ClusterServer:
    """A cluster node serving ``world`` (a TreeWorld, the same on every node) through the
    Redis at ``redis_url`` (module docstring). ValueError for a world a cluster cannot serve,
    a world that differs from the other nodes', or Redis that cannot be reached."""
    if not isinstance(world, TreeWorld):
        raise ValueError("--redis serves tree worlds (--world sim:...); the plugin village "
                         "runs on one node")
    node = node_id or f"node-{uuid.uuid4().hex[:8]}"
    if not node or any(c in node for c in " \t\n"):
        raise ValueError(f"--node-id {node!r}: no spaces")
    r = connect_redis(redis_url)
    keys = Keys(prefix)
    backplane = Backplane(r, keys, node)
    cworld = ClusterWorld(world, backplane, LeaseTable(r, keys, node, lease_ms),
                          area_size=area_size)
    from .cluster_world import REDIS_ERRORS

    try:
        backplane.join(cworld.fingerprint())
        aof = r.config_get("appendonly").get("appendonly")
    except REDIS_ERRORS as exc:
        raise ValueError(f"cannot reach Redis at {redis_url}: {exc}") from None
    if aof != "yes":
        log.warning("Redis at %s runs without appendonly: an acknowledged intent survives a "
                    "node crash but not a Redis crash (docs/scale_out.md)", redis_url)
    return ClusterServer(cworld, config, RedisStore(cworld, redis_url))
