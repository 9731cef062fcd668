"""The asyncio layer: WebSocket game protocol plus an HTTP side port, over :class:`SyncCore`.

Connections run on :mod:`server_sync.transport.ws_io` (websockets' sans-I/O server protocol under an
asyncio.Protocol): every inbound message is handled synchronously as it arrives, with no
task per connection, behind the gate it shares with the dialogue server
(:mod:`server_sync.transport.gate`: hello with a valid token within ``hello_timeout_s``, 1009 size
limit, rate limit, schema validation, ``error`` + close on any violation, ``slow_consumer``
past ``max_outbound_bytes``). A client's frames of a tick go out in one write.

When the core fails closed (the journal cannot be written, :mod:`server_sync.sync.core`),
every connection gets ``error unavailable`` and close code 1013, new hellos get the same,
and ``/health`` is ``degraded`` with the database's own error, until the core recovers.

HTTP (:mod:`server_sync.sync.http_port`): ``/health``, ``/metrics``, and with an
``admin_token`` the admin endpoints and the plugin inspector.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import Histogram
from prometheus_client.core import Metric

from ..transport.gate import GateConfig, GateConn, GatedServer, RateBucket, close_with, ws_frame
from ..transport.wire import PROTOCOL_VERSION, Codec, ProtocolError
from ..transport.ws_io import WsServerConnection
from .core import Session, SyncCore
from .persistence import Store
from .protocol import decode_client
from .world import SyncWorld

# RateBucket, close_with and ws_frame live in server_sync.transport.gate; re-exported for old imports
__all__ = ["RateBucket", "ServerConfig", "SyncServer", "close_with", "ws_frame"]

log = logging.getLogger("flashnpc.server_sync")

#: the reason of the ``replaced`` error and close: the player said hello on another connection
REPLACED_REASON = "player connected again"

# bucket bounds (seconds) of flashnpc_sync_tick_duration_seconds: 20 Hz gives a tick 50 ms
TICK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


@dataclass
class ServerConfig(GateConfig):
    """The gate's settings (:class:`server_sync.transport.gate.GateConfig`) plus the world's."""

    port: int = 8765
    http_port: int | None = 8766
    tick_hz: float = 20.0
    radius: float = 100.0
    ring_size: int = 64
    grace_s: float = 30.0
    snapshot_every_s: float = 60.0
    admin_token: str | None = None
    # server authority (server_sync.sync.authority)
    max_speed: float = 50.0  # units per second
    move_burst_s: float = 2.0  # seconds of movement a player may bank
    talk_range: float | None = None  # None: the interest radius
    bounds: tuple[float, float, float, float] | None = None  # None: NPCs' box grown by radius


class SyncServer(GatedServer):
    """Serve ``world`` per ``config``; ``store`` adds persistence (and recovery)."""

    protocol_version = PROTOCOL_VERSION
    schema_name = "sync"
    #: the core class (a cluster node serves a subclass: server_sync.cluster.node)
    core_class: type[SyncCore] = SyncCore

    def __init__(self, world: SyncWorld, config: ServerConfig, store: Store | None = None) -> None:
        super().__init__(config)
        self.config: ServerConfig = config
        self.core = self.core_class(world, radius=config.radius, ring_size=config.ring_size,
                             grace_s=config.grace_s, store=store,
                             snapshot_every_s=config.snapshot_every_s,
                             max_speed=config.max_speed, move_burst_s=config.move_burst_s,
                             talk_range=config.talk_range, bounds=config.bounds,
                             tick_hz=config.tick_hz)
        self.store = store
        self.conns: dict[str, WsServerConnection] = {}  # player -> its live connection
        self.tick_seconds = 0.0  # duration of the last tick (world step to frames written)
        self.tick_history: deque[float] = deque(maxlen=4096)
        # every tick's duration, for /metrics (a histogram outside any registry; the HTTP
        # port's collector yields it)
        self.tick_duration = Histogram("flashnpc_sync_tick_duration_seconds",
                                       "Duration of each server tick (world step to frames written).",
                                       buckets=TICK_BUCKETS, registry=None)
        self.tick_overruns = 0
        self.started_at = time.time()
        self.last_tick_error: tuple[float, str] | None = None
        self._outages_seen = 0
        self._http_runner: Any = None
        self._tick_task: asyncio.Task[None] | None = None
        self.http_port: int | None = None

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        c = self.config
        await self.listen()
        if c.http_port is not None:
            from .http_port import start_http
            self._http_runner, self.http_port = await start_http(self, c.host, c.http_port)
        self._tick_task = asyncio.get_running_loop().create_task(self._tick_loop())
        self.gc.start()

    async def stop(self) -> None:
        self.gc.stop()
        if self._tick_task is not None:
            self._tick_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._tick_task
        await self.close_all(ws.state for ws in self.conns.values())
        if self._http_runner is not None:
            await self._http_runner.cleanup()
        if self.store is not None:
            self.store.close()

    async def __aenter__(self) -> SyncServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- health --------------------------------------------------------------------------
    def extra_metrics(self) -> Iterator[Metric]:
        """Metrics a subclass adds to /metrics (none here)."""
        return iter(())

    def health(self) -> dict[str, Any]:
        reasons = []
        period = 1.0 / self.config.tick_hz
        if self._tick_task is None or self._tick_task.done():
            reasons.append("tick loop not running")
        if self.core.unavailable is not None:
            reasons.append(f"journal unavailable, clients refused: {self.core.unavailable}")
        if self.core.snapshot_error is not None:
            reasons.append(f"last snapshot failed (the journal still works): "
                           f"{self.core.snapshot_error}")
        if self.last_tick_error is not None and time.time() - self.last_tick_error[0] < 60:
            reasons.append(f"a tick failed in the last minute: {self.last_tick_error[1]}")
        if self.tick_seconds > period:
            reasons.append(f"last tick took {self.tick_seconds * 1000:.0f} ms "
                           f"(budget {period * 1000:.0f} ms)")
        return {"status": "degraded" if reasons else "ready", "reasons": reasons,
                "clients": len(self.conns), "sessions": len(self.core.sessions),
                "epoch": self.core.epoch}

    # ---- ticking -------------------------------------------------------------------------
    async def _tick_loop(self) -> None:
        loop = asyncio.get_running_loop()
        period = 1.0 / self.config.tick_hz
        next_at = loop.time()
        last = time.time()
        while True:
            next_at += period
            delay = next_at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                self.tick_overruns += 1
                next_at = loop.time()  # fell behind: do not burst to catch up
                await asyncio.sleep(0)
            t0 = time.perf_counter()
            now = time.time()
            dt, last = min(now - last, 0.25), now
            try:
                out = self.core.tick(dt, now)
            except Exception as exc:  # a bug in the world: say so on /health
                log.exception("tick failed")
                self.errors["tick_failed"] += 1
                self.last_tick_error = (time.time(), f"{type(exc).__name__}: {exc}")
                continue
            if self.core.outages_total != self._outages_seen:
                self._outages_seen = self.core.outages_total
                self._refuse_all()
            for s in out:
                self._flush(s)
            self.tick_seconds = time.perf_counter() - t0
            self.tick_history.append(self.tick_seconds)
            self.tick_duration.observe(self.tick_seconds)
            self.gc.step()

    def _refuse_all(self) -> None:
        """The core failed closed: close every connection with ``unavailable`` (1013)."""
        reason = f"the server cannot save the world now ({self.core.unavailable}); try again later"
        for ws in list(self.conns.values()):
            self.kick(ws.state, "unavailable", reason, notify=True)
        self.conns.clear()

    def _flush(self, s: Session) -> None:
        ws = self.conns.get(s.player_id)
        frames, s.outbox = s.outbox, []
        if ws is not None:  # one write (one send syscall) per client per flush
            self.write(ws.state, frames)

    # ---- connections (the gate's hooks) --------------------------------------------------
    def decode(self, frame: bytes | str) -> tuple[dict[str, Any], Codec]:
        return decode_client(frame)

    def new_conn(self, ws: WsServerConnection, timer: asyncio.TimerHandle) -> _Conn:
        return _Conn(ws, timer)

    def admit(self, conn: GateConn, hello: dict[str, Any]) -> None:
        if self.core.unavailable is not None:
            raise ProtocolError("unavailable", f"the server cannot save the world now "
                                               f"({self.core.unavailable}); try again later")

    def welcome(self, conn: GateConn, hello: dict[str, Any]) -> None:
        assert isinstance(conn, _Conn) and conn.player is not None
        old = self.conns.pop(conn.player, None)
        if old is not None:  # often a dropped link the server has not noticed yet
            self.kick(old.state, "replaced", REPLACED_REASON, notify=True)
        conn.session = self.core.hello(conn.player, hello, conn.codec)
        self.conns[conn.player] = conn.ws
        self._flush(conn.session)

    def handle(self, conn: GateConn, msg: dict[str, Any]) -> None:
        s = conn.session  # type: ignore[attr-defined]
        self.core.receive(s, msg)
        if s.outbox:
            self._flush(s)

    def bye(self, conn: GateConn) -> None:
        self.core.drop(conn.session)  # type: ignore[attr-defined]

    def closed(self, conn: GateConn) -> None:
        s = conn.session  # type: ignore[attr-defined]
        if s is not None and self.conns.get(s.player_id) is conn.ws:
            del self.conns[s.player_id]
            if self.core.sessions.get(s.player_id) is s:
                self.core.detach(s, time.time())


@dataclass(eq=False)
class _Conn(GateConn):
    """A sync connection: the gate's state plus its session once the hello is accepted."""

    session: Session | None = None
