"""The asyncio layer: WebSocket game protocol plus an HTTP side port, over :class:`SyncCore`.

Connections run on :mod:`server_sync.ws_io` (websockets' sans-I/O server protocol under an
asyncio.Protocol): every inbound message is handled synchronously as it arrives, with no
task per connection. Per connection: the first frame must be a ``hello`` with a valid token (within
``hello_timeout_s``); every inbound frame is size-limited (``max_frame``, default 4 KiB,
enforced by websockets with close code 1009), rate-limited (token bucket) and
schema-validated; a violation gets an ``error`` frame and a close whose reason is the
error code. Outbound frames go straight into the socket's write buffer once per tick; a
client whose unsent backlog exceeds ``max_outbound_bytes`` is disconnected with
``slow_consumer`` instead of growing server memory.

HTTP (aiohttp, ``http_port``): ``/health`` (``ready`` or ``degraded`` with reasons),
``/metrics`` (Prometheus text format), and with an ``admin_token`` the load-test hooks
``/admin/stats``, ``/admin/areas`` and ``POST /admin/freeze`` (header
``Authorization: Bearer <admin_token>``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from websockets.exceptions import ConnectionClosed

from .auth import verify_token
from .core import Session, SyncCore
from .gc_policy import GcPolicy
from .persistence import Store
from .protocol import PROTOCOL_VERSION, ProtocolError, decode_client, encode
from .world import SyncWorld
from .ws_io import WsServer, WsServerConnection, ws_serve

__all__ = ["RateBucket", "ServerConfig", "SyncServer", "close_with", "ws_frame"]

log = logging.getLogger("flashnpc.server_sync")


def ws_frame(message: bytes | str) -> bytes:
    """``message`` as one whole, unmasked WebSocket data frame (RFC 6455 section 5.2): binary
    for bytes, text (UTF-8) for str.

    The tick writes every client's frames straight into its transport with this: that is what
    ``websockets.broadcast`` ends up writing for a server (no masking; compression is off on
    these servers), without its per-frame objects and checks, which cost about a third of the
    server's CPU per frame sent in the 5,000-client load test. Callers check that the
    connection is OPEN first, so nothing follows a close frame."""
    if isinstance(message, str):
        payload, opcode = message.encode(), 0x81
    else:
        payload, opcode = message, 0x82
    n = len(payload)
    if n < 126:
        return bytes((opcode, n)) + payload
    if n < 65536:
        return struct.pack("!BBH", opcode, 126, n) + payload
    return struct.pack("!BBQ", opcode, 127, n) + payload


@dataclass
class ServerConfig:
    secret: bytes
    host: str = "127.0.0.1"
    port: int = 8765
    http_port: int | None = 8766  # None: no HTTP side port
    tick_hz: float = 20.0
    radius: float = 100.0
    ring_size: int = 64
    grace_s: float = 30.0
    max_frame: int = 4096
    rate_per_s: float = 20.0
    rate_burst: float = 40.0
    max_outbound_bytes: int = 256 * 1024
    hello_timeout_s: float = 5.0
    snapshot_every_s: float = 60.0
    admin_token: str | None = None
    listen_backlog: int = 4096  # a reconnect storm must not overflow the accept queue
    # Garbage collection (server_sync.gc_policy): survivors frozen every `gc_freeze_every_s`,
    # one full sweep every `gc_sweep_every_s`; 0 disables both.
    gc_freeze_every_s: float = 1.0
    gc_sweep_every_s: float = 300.0


def close_with(ws: WsServerConnection, code: str, reason: str, codec: Any, *, notify: bool) -> None:
    """Close ``ws`` with policy code 1008 and reason ``code: reason`` without waiting for the
    client (``notify``: send an ``error`` message first). The transport is aborted if the
    close handshake has not finished within the connection's close timeout, so a client that
    does not read cannot hold the server's memory."""
    if notify and ws.open:
        ws.send(encode({"t": "error", "code": code, "reason": reason[:800]}, codec))
    ws.close(1008, f"{code}: {reason}")


class RateBucket:
    """Per-connection token bucket: ``rate_per_s`` messages per second, bursts of ``burst``."""

    __slots__ = ("burst", "last", "rate_per_s", "tokens")

    def __init__(self, rate_per_s: float, burst: float, now: float) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.tokens = burst
        self.last = now

    def take(self, now: float) -> None:
        """Spend one token for a message received at ``now``; ProtocolError if none is left."""
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate_per_s)
        self.last = now
        if self.tokens < 1.0:
            raise ProtocolError("rate_limited", f"more than {self.rate_per_s:g} messages/s "
                                                f"(burst {self.burst:g})")
        self.tokens -= 1.0


class SyncServer:
    """Serve ``world`` per ``config``; ``store`` adds persistence (and recovery)."""

    def __init__(self, world: SyncWorld, config: ServerConfig, store: Store | None = None) -> None:
        self.config = config
        self.core = SyncCore(world, radius=config.radius, ring_size=config.ring_size,
                             grace_s=config.grace_s, store=store,
                             snapshot_every_s=config.snapshot_every_s)
        self.store = store
        self.conns: dict[str, WsServerConnection] = {}
        self.errors: Counter[str] = Counter()
        self.bytes_out = 0
        self.frames_out = 0
        self.connections_total = 0
        self.tick_seconds = 0.0  # duration of the last tick (world step to frames written)
        self.tick_history: deque[float] = deque(maxlen=4096)
        self.gc = GcPolicy(config.gc_freeze_every_s, config.gc_sweep_every_s)
        self.tick_overruns = 0
        self.started_at = time.time()
        self.last_tick_error: tuple[float, str] | None = None
        self._ws_server: WsServer | None = None
        self._http_runner: Any = None
        self._tick_task: asyncio.Task[None] | None = None
        self.port: int | None = None
        self.http_port: int | None = None

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        c = self.config
        self._ws_server = await ws_serve(self, c.host, c.port, max_size=c.max_frame,
                                         backlog=c.listen_backlog, close_timeout_s=2.0,
                                         ping_interval_s=20.0, ping_timeout_s=20.0)
        self.port = self._ws_server.port
        if c.http_port is not None:
            from .http import start_http
            self._http_runner, self.http_port = await start_http(self, c.host, c.http_port)
        self._tick_task = asyncio.get_running_loop().create_task(self._tick_loop())
        self.gc.start()

    async def stop(self) -> None:
        self.gc.stop()
        if self._tick_task is not None:
            self._tick_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._tick_task
        if self._ws_server is not None:
            for ws in list(self.conns.values()):
                with contextlib.suppress(ConnectionClosed):
                    ws.send(encode({"t": "bye", "reason": "server_shutdown"},
                                   self._codec_of(ws)))
            await self._ws_server.close()
        if self._http_runner is not None:
            await self._http_runner.cleanup()
        if self.store is not None:
            self.store.close()

    async def __aenter__(self) -> SyncServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _codec_of(self, ws: WsServerConnection) -> Any:
        return ws.state.codec

    # ---- health --------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        reasons = []
        period = 1.0 / self.config.tick_hz
        if self._tick_task is None or self._tick_task.done():
            reasons.append("tick loop not running")
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
            except Exception as exc:  # e.g. the database is full: say so on /health
                log.exception("tick failed")
                self.errors["tick_failed"] += 1
                self.last_tick_error = (time.time(), repr(exc))
                continue
            for s in out:
                self._flush(s)
            self.tick_seconds = time.perf_counter() - t0
            self.tick_history.append(self.tick_seconds)
            self.gc.step()

    def _flush(self, s: Session) -> None:
        ws = self.conns.get(s.player_id)
        frames, s.outbox = s.outbox, []
        if ws is None:
            return
        transport = ws.transport
        if transport is None or not ws.open:
            return
        data = b"".join(ws_frame(f) for f in frames)
        transport.write(data)  # one write (one send syscall) per client per flush
        self.bytes_out += len(data)
        self.frames_out += len(frames)
        backlog = transport.get_write_buffer_size()
        if backlog > self.config.max_outbound_bytes:
            self._kick(ws, "slow_consumer", f"{backlog} bytes unsent (limit "
                                            f"{self.config.max_outbound_bytes})")

    def _kick(self, ws: WsServerConnection, code: str, reason: str, *,
              notify: bool = False) -> None:
        self.errors[code] += 1
        close_with(ws, code, reason, self._codec_of(ws), notify=notify)

    def _refuse(self, ws: WsServerConnection, err: ProtocolError) -> None:
        """Tell a client why it is refused (an ``error`` message), then close."""
        self._kick(ws, err.code, err.reason[:800], notify=True)

    # ---- connections (server_sync.ws_io.ServerHandler) -----------------------------------
    def on_open(self, ws: WsServerConnection) -> None:
        self.connections_total += 1
        ws.state = _Conn(ws.loop.call_later(self.config.hello_timeout_s, self._hello_timeout, ws))

    def _hello_timeout(self, ws: WsServerConnection) -> None:
        if ws.state.session is None:
            self._refuse(ws, ProtocolError("not_authenticated", "no hello within the timeout"))

    def on_message(self, ws: WsServerConnection, frame: bytes | str) -> None:
        conn: _Conn = ws.state
        try:
            s = conn.session
            if s is None:
                self._hello(ws, conn, frame)
                return
            conn.bucket.take(time.monotonic())
            msg, _ = decode_client(frame)
            if msg["t"] == "bye":
                self.core.drop(s)
                ws.close(1000, "bye")
                return
            self.core.receive(s, msg)
            if s.outbox:
                self._flush(s)
        except ProtocolError as err:
            self._refuse(ws, err)

    def _hello(self, ws: WsServerConnection, conn: _Conn, frame: bytes | str) -> None:
        msg, conn.codec = decode_client(frame)
        if msg["t"] != "hello":
            raise ProtocolError("not_authenticated", f"first message must be hello, "
                                                     f"got {msg['t']}")
        player = verify_token(self.config.secret, msg["token"])
        if msg["v"] != PROTOCOL_VERSION:  # refuse before touching a live connection
            raise ProtocolError("unsupported_version", f"server speaks protocol "
                                f"{PROTOCOL_VERSION}, client {msg['v']}")
        old = self.conns.pop(player, None)
        if old is not None:  # often a dropped link the server has not noticed yet
            self._kick(old, "replaced", "player connected again", notify=True)
        s = self.core.hello(player, msg, conn.codec)
        conn.session = s
        conn.timer.cancel()
        conn.bucket = RateBucket(self.config.rate_per_s, self.config.rate_burst,
                                 time.monotonic())
        self.conns[player] = ws
        self._flush(s)

    def on_close(self, ws: WsServerConnection) -> None:
        conn: _Conn = ws.state
        conn.timer.cancel()
        sent = ws.protocol.close_sent
        if sent is not None and sent.code == 1009:
            self.errors["too_big"] += 1
        s = conn.session
        if s is not None and self.conns.get(s.player_id) is ws:
            del self.conns[s.player_id]
            if self.core.sessions.get(s.player_id) is s:
                self.core.detach(s, time.time())


@dataclass
class _Conn:
    """A connection's state on the server: before the hello only the timer is set."""

    timer: asyncio.TimerHandle
    codec: Any = "json"
    session: Session | None = None
    bucket: RateBucket | None = None  # type: ignore[assignment]
