"""What the sync server and the dialogue server do alike for every connection.

Both run on :mod:`server_sync.transport.ws_io` and share one gate (:class:`GatedServer`):

- the first message must be a ``hello`` (``t``, ``v``, ``token``) within ``hello_timeout_s``,
  with a token :func:`server_sync.transport.auth.verify_token` accepts and the server's protocol version;
- after it, every message spends a token of a per-connection :class:`RateBucket`; ``bye``
  closes the connection (1000) and a second ``hello`` is refused;
- any :class:`~server_sync.transport.wire.ProtocolError` gets an ``error`` message and a close with
  policy code 1008 whose reason is the error code (:func:`close_with`);
- outbound frames go straight into the socket's write buffer (:meth:`GatedServer.write`); a
  client whose unsent backlog passes ``max_outbound_bytes`` is dropped as ``slow_consumer``;
- a frame over ``max_frame`` is closed by websockets with 1009 and counted as ``too_big``.

A server subclasses :class:`GatedServer` and supplies its codec (``decode``), protocol version,
per-connection state (``new_conn``) and what happens on ``welcome``, each later message
(``handle``), ``bye`` and close (``closed``). The gate also owns the process's
:class:`~server_sync.transport.gc_policy.GcPolicy` (``self.gc``): thousands of connections' objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from websockets.exceptions import ConnectionClosed

from .auth import verify_token
from .gc_policy import GcPolicy
from .wire import Codec, ProtocolError, encode
from .ws_io import WsServer, WsServerConnection, ws_serve

__all__ = ["GateConfig", "GateConn", "GatedServer", "RateBucket", "close_with", "ws_frame"]


def ws_frame(message: bytes | str) -> bytes:
    """``message`` as one whole, unmasked WebSocket data frame (RFC 6455 section 5.2): binary
    for bytes, text (UTF-8) for str.

    Outbound frames are written straight into the transport with this: that is what
    ``websockets.broadcast`` ends up writing for a server (no masking; compression is off on
    these servers), without its per-frame objects and checks (in a cProfile of the 5,000-client
    load test, about 30% of the time spent sending a frame). Callers check that the
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


@dataclass
class GateConfig:
    """What both servers' configs hold (they subclass it and set their own ports)."""

    secret: bytes
    host: str = "127.0.0.1"  # loopback unless told otherwise
    port: int = 0
    http_port: int | None = None  # None: no HTTP side port
    max_frame: int = 4096  # inbound frame limit (bytes); websockets closes with 1009 past it
    rate_per_s: float = 20.0
    rate_burst: float = 40.0
    max_outbound_bytes: int = 256 * 1024
    hello_timeout_s: float = 5.0
    listen_backlog: int = 4096  # a reconnect storm must not overflow the accept queue
    # Garbage collection (server_sync.transport.gc_policy): survivors frozen every `gc_freeze_every_s`,
    # one full sweep every `gc_sweep_every_s`; 0 disables both.
    gc_freeze_every_s: float = 1.0
    gc_sweep_every_s: float = 300.0


@dataclass(eq=False)
class GateConn:
    """A connection's state: before the hello only ``ws`` and the hello ``timer`` are set."""

    ws: WsServerConnection
    timer: asyncio.TimerHandle
    codec: Codec = "json"
    player: str | None = None
    bucket: RateBucket | None = None


class GatedServer:
    """The shared connection handling (see the module docstring); a
    :class:`server_sync.transport.ws_io.ServerHandler`."""

    protocol_name = "protocol"
    protocol_version = 1

    def __init__(self, config: GateConfig) -> None:
        self.config = config
        self.gc = GcPolicy(config.gc_freeze_every_s, config.gc_sweep_every_s)
        self.errors: Counter[str] = Counter()
        self.bytes_out = 0
        self.frames_out = 0
        self.connections_total = 0
        self._ws_server: WsServer | None = None
        self.port: int | None = None

    # ---- what a server supplies ----------------------------------------------------------
    def decode(self, frame: bytes | str) -> tuple[dict[str, Any], Codec]:
        raise NotImplementedError

    def new_conn(self, ws: WsServerConnection, timer: asyncio.TimerHandle) -> GateConn:
        return GateConn(ws, timer)

    def welcome(self, conn: GateConn, hello: dict[str, Any]) -> None:
        """The hello was accepted (``conn.player`` is set)."""

    def handle(self, conn: GateConn, msg: dict[str, Any]) -> None:
        """A later, validated message (not ``hello`` or ``bye``)."""

    def bye(self, conn: GateConn) -> None:
        """The client said bye; the connection closes next."""

    def closed(self, conn: GateConn) -> None:
        """The connection is gone (for any reason)."""

    # ---- listening -----------------------------------------------------------------------
    async def listen(self) -> None:
        c = self.config
        self._ws_server = await ws_serve(self, c.host, c.port, max_size=c.max_frame,
                                         backlog=c.listen_backlog, close_timeout_s=2.0,
                                         ping_interval_s=20.0, ping_timeout_s=20.0)
        self.port = self._ws_server.port

    async def close_all(self, conns: Iterable[GateConn]) -> None:
        """Say ``bye`` (``server_shutdown``) to ``conns``, stop listening, close everything."""
        if self._ws_server is None:
            return
        for conn in list(conns):
            with contextlib.suppress(ConnectionClosed):
                conn.ws.send(encode({"t": "bye", "reason": "server_shutdown"}, conn.codec))
        await self._ws_server.close()

    # ---- sending -------------------------------------------------------------------------
    def write(self, conn: GateConn, data: bytes, frames: int) -> None:
        """Write ``frames`` pre-framed messages (:func:`ws_frame`) in one write; drop a client
        whose unsent backlog passes ``max_outbound_bytes``."""
        ws = conn.ws
        transport = ws.transport
        if transport is None or not ws.open:
            return
        transport.write(data)
        self.bytes_out += len(data)
        self.frames_out += frames
        backlog = transport.get_write_buffer_size()
        if backlog > self.config.max_outbound_bytes:
            self.kick(conn, "slow_consumer", f"{backlog} bytes unsent (limit "
                                             f"{self.config.max_outbound_bytes})")

    def kick(self, conn: GateConn, code: str, reason: str, *, notify: bool = False) -> None:
        self.errors[code] += 1
        close_with(conn.ws, code, reason, conn.codec, notify=notify)

    # ---- connections (server_sync.transport.ws_io.ServerHandler) -----------------------------------
    def on_open(self, ws: WsServerConnection) -> None:
        self.connections_total += 1
        ws.state = self.new_conn(ws, ws.loop.call_later(self.config.hello_timeout_s,
                                                        self._hello_timeout, ws))

    def _hello_timeout(self, ws: WsServerConnection) -> None:
        conn: GateConn = ws.state
        if conn.player is None:
            self.kick(conn, "not_authenticated", "no hello within the timeout", notify=True)

    def on_message(self, ws: WsServerConnection, frame: bytes | str) -> None:
        conn: GateConn = ws.state
        try:
            if conn.player is None:
                self._hello(conn, frame)
                return
            assert conn.bucket is not None
            conn.bucket.take(time.monotonic())
            msg, _ = self.decode(frame)
            t = msg["t"]
            if t == "bye":
                self.bye(conn)
                ws.close(1000, "bye")
            elif t == "hello":
                raise ProtocolError("bad_message", "hello: already authenticated")
            else:
                self.handle(conn, msg)
        except ProtocolError as err:
            self.kick(conn, err.code, err.reason, notify=True)

    def _hello(self, conn: GateConn, frame: bytes | str) -> None:
        msg, conn.codec = self.decode(frame)
        if msg["t"] != "hello":
            raise ProtocolError("not_authenticated", f"first message must be hello, got {msg['t']}")
        player = verify_token(self.config.secret, msg["token"])
        if msg["v"] != self.protocol_version:  # refuse before touching a live connection
            raise ProtocolError("unsupported_version", f"server speaks {self.protocol_name} "
                                f"{self.protocol_version}, client {msg['v']}")
        conn.timer.cancel()
        conn.player = player
        conn.bucket = RateBucket(self.config.rate_per_s, self.config.rate_burst, time.monotonic())
        self.welcome(conn, msg)

    def on_close(self, ws: WsServerConnection) -> None:
        conn: GateConn = ws.state
        conn.timer.cancel()
        sent = ws.protocol.close_sent
        if sent is not None and sent.code == 1009:
            self.errors["too_big"] += 1
        self.closed(conn)
