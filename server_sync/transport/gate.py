"""What the sync server and the dialogue server do alike for every connection.

Both run on :mod:`server_sync.transport.ws_io` and share one gate (:class:`GatedServer`):

- the first message must be a ``hello`` (``t``, ``v``, ``token``) within ``hello_timeout_s``,
  with a JWT the server's :class:`~server_sync.transport.auth.TokenVerifier` accepts, not
  revoked, and the server's protocol version;
- the connection is closed (``token_expired``) when its token's ``exp`` passes;
- after it, every message spends a token of a per-connection :class:`RateBucket`; ``bye``
  revokes the connection's token (:class:`~server_sync.transport.auth.RevokedTokens`) and
  closes the connection (1000); a second ``hello`` is refused;
- any :class:`~server_sync.transport.wire.ProtocolError` gets an ``error`` message and a close
  whose reason starts with the error code (:meth:`GatedServer.kick`): policy code 1008, or
  1013 (try again later) for ``unavailable``; a text frame that is not UTF-8 gets
  ``bad_frame`` and close code 1007;
- every outbound message goes through :meth:`GatedServer.write`, straight into the socket's
  write buffer; a client whose unsent backlog passes ``max_outbound_bytes`` is dropped as
  ``slow_consumer`` (with an ``error`` frame behind the backlog), and no single frame is ever
  bigger than ``max_outbound_bytes`` (the connection is closed the same way instead). :data:`outbound_check`, when
  set (the test suite sets it), sees every message a server sends;
- a frame over ``max_frame`` is closed by websockets with 1009 and counted as ``too_big``.

A server subclasses :class:`GatedServer` and supplies its codec (``decode``), protocol version,
per-connection state (``new_conn``) and what happens on ``welcome``, each later message
(``handle``), ``bye`` and close (``closed``). The gate also owns the process's
:class:`~server_sync.transport.gc_policy.GcPolicy` (``self.gc``): thousands of connections' objects.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .auth import DEFAULT_AUDIENCE, Claims, RevokedTokens, TokenVerifier
from .gc_policy import GcPolicy
from .wire import MAX_REASON_LEN, Codec, ProtocolError, encode
from .ws_io import WsServer, WsServerConnection, ws_serve

__all__ = ["CLOSE_CODES", "GateConfig", "GateConn", "GatedServer", "RateBucket", "close_with",
           "outbound_check", "ws_frame"]

#: close codes other than 1008 (policy violation) for an error code
CLOSE_CODES = {"unavailable": 1013}

#: when set, called with (schema name, frame) for every message a server sends (tests)
outbound_check: Callable[[str, bytes | str], None] | None = None


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


def close_with(ws: WsServerConnection, code: str, reason: str, *, close_code: int = 1008) -> None:
    """Close ``ws`` with ``close_code`` and reason ``code: reason`` (cut to 123 bytes) without
    waiting for the client. The transport is aborted if the close handshake has not finished
    within the connection's close timeout, so a client that does not read cannot hold the
    server's memory."""
    ws.close(close_code, f"{code}: {reason}")


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
    # tokens: HS256 with `secret`, plus the algorithm of `public_key` (PEM) when set
    public_key: str | None = None
    audience: str = DEFAULT_AUDIENCE
    # Garbage collection (server_sync.transport.gc_policy): survivors frozen every `gc_freeze_every_s`,
    # one full sweep every `gc_sweep_every_s`; 0 disables both.
    gc_freeze_every_s: float = 1.0
    gc_sweep_every_s: float = 300.0


@dataclass(eq=False)
class GateConn:
    """A connection's state: before the hello only ``ws`` and the hello ``timer`` are set."""

    ws: WsServerConnection
    timer: asyncio.TimerHandle  # the hello timeout, then the token's expiry
    codec: Codec = "json"
    player: str | None = None
    bucket: RateBucket | None = None
    claims: Claims | None = None


class GatedServer:
    """The shared connection handling (see the module docstring); a
    :class:`server_sync.transport.ws_io.ServerHandler`."""

    protocol_name = "protocol"
    schema_name = ""  # the protocol table's name (server_sync.schemas), for outbound_check
    protocol_version = 1

    def __init__(self, config: GateConfig) -> None:
        self.config = config
        self.verifier = TokenVerifier(config.secret, public_key=config.public_key,
                                      audience=config.audience)
        self.revoked = RevokedTokens()
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

    def admit(self, conn: GateConn, hello: dict[str, Any]) -> None:
        """Before a valid hello is accepted: raise ProtocolError to refuse it."""

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
            self.send(conn, {"t": "bye", "reason": "server_shutdown"})
        await self._ws_server.close()

    # ---- sending -------------------------------------------------------------------------
    def write(self, conn: GateConn, messages: list[bytes | str]) -> None:
        """Write encoded ``messages`` as WebSocket frames in one write (one send syscall);
        drop a client whose unsent backlog passes ``max_outbound_bytes``."""
        ws = conn.ws
        transport = ws.transport
        if transport is None or not ws.open or not messages:
            return
        if outbound_check is not None:
            for m in messages:
                outbound_check(self.schema_name, m)
        data = b"".join(ws_frame(m) for m in messages) if len(messages) > 1 \
            else ws_frame(messages[0])
        limit = self.config.max_outbound_bytes
        if len(data) > limit:  # no single frame may be over it: clients size buffers by it
            big = max(len(ws_frame(m)) for m in messages)
            if big > limit:
                self.kick(conn, "slow_consumer", f"a {big}-byte frame is over the server's "
                                                 f"outbound limit ({limit} bytes)", notify=True)
                return
        transport.write(data)
        self.bytes_out += len(data)
        self.frames_out += len(messages)
        backlog = transport.get_write_buffer_size()
        if backlog > self.config.max_outbound_bytes:
            self.kick(conn, "slow_consumer", f"{backlog} bytes unsent (limit "
                                             f"{self.config.max_outbound_bytes})", notify=True)

    def send(self, conn: GateConn, message: dict[str, Any]) -> None:
        """Encode ``message`` in the connection's codec and :meth:`write` it."""
        self.write(conn, [encode(message, conn.codec)])

    def kick(self, conn: GateConn, code: str, reason: str, *, notify: bool = False) -> None:
        """Close ``conn`` for ``code`` (``notify``: send an ``error`` message first); the
        close code is 1008 unless :data:`CLOSE_CODES` says otherwise."""
        self.errors[code] += 1
        ws = conn.ws
        if notify and ws.open and ws.transport is not None:
            frame = encode({"t": "error", "code": code,
                            "reason": reason[:MAX_REASON_LEN * 4]}, conn.codec)
            if outbound_check is not None:
                outbound_check(self.schema_name, frame)
            ws.transport.write(ws_frame(frame))  # behind any backlog: no recursion into write
        close_with(ws, code, reason, close_code=CLOSE_CODES.get(code, 1008))

    # ---- connections (server_sync.transport.ws_io.ServerHandler) -----------------------------------
    def on_open(self, ws: WsServerConnection) -> None:
        self.connections_total += 1
        ws.state = self.new_conn(ws, ws.loop.call_later(self.config.hello_timeout_s,
                                                        self._hello_timeout, ws))

    def _hello_timeout(self, ws: WsServerConnection) -> None:
        conn: GateConn = ws.state
        if conn.player is None:
            self.kick(conn, "not_authenticated", "no hello within the timeout", notify=True)

    def _token_expired(self, conn: GateConn) -> None:
        assert conn.claims is not None
        self.kick(conn, "token_expired", f"token expired at {conn.claims.exp:.0f}", notify=True)

    def on_invalid_text(self, ws: WsServerConnection, reason: str) -> None:
        """A text frame that is not UTF-8: ``bad_frame``, then close code 1007."""
        conn: GateConn = ws.state
        self.errors["bad_frame"] += 1
        self.send(conn, {"t": "error", "code": "bad_frame", "reason": reason})
        close_with(ws, "bad_frame", reason, close_code=1007)

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
                if conn.claims is not None:
                    self.revoked.revoke(conn.claims, time.time())
                ws.close(1000, "bye")
            elif t == "hello":
                raise ProtocolError("bad_message", "hello: already authenticated")
            else:
                self.handle(conn, msg)
        except ProtocolError as err:
            self.kick(conn, err.code, err.reason, notify=True)

    def _hello(self, conn: GateConn, frame: bytes | str) -> None:
        conn.codec = "json" if isinstance(frame, str) else "msgpack"  # errors in the client's codec
        msg, _ = self.decode(frame)
        if msg["t"] != "hello":
            raise ProtocolError("not_authenticated", f"first message must be hello, got {msg['t']}")
        now = time.time()
        claims = self.verifier.verify(msg["token"], now=now)
        if claims.key in self.revoked:
            raise ProtocolError("auth_failed", "token was ended with bye; get a new one")
        if msg["v"] != self.protocol_version:  # refuse before touching a live connection
            raise ProtocolError("unsupported_version", f"server speaks {self.protocol_name} "
                                f"{self.protocol_version}, client {msg['v']}")
        self.admit(conn, msg)  # raises ProtocolError to refuse (e.g. unavailable)
        conn.timer.cancel()
        conn.timer = conn.ws.loop.call_later(claims.exp - now, self._token_expired, conn)
        conn.player = claims.sub
        conn.claims = claims
        conn.bucket = RateBucket(self.config.rate_per_s, self.config.rate_burst, time.monotonic())
        self.welcome(conn, msg)

    def on_close(self, ws: WsServerConnection) -> None:
        conn: GateConn = ws.state
        conn.timer.cancel()
        sent = ws.protocol.close_sent
        if sent is not None and sent.code == 1009:
            self.errors["too_big"] += 1
        self.closed(conn)
