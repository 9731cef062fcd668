"""A thin asyncio layer over websockets' sans-I/O protocols, for the sync server and client.

``websockets.asyncio`` hands every message through a queue to a task that wakes up to
``recv`` it. The sync protocol is a steady stream of small messages each handled in a few
microseconds, so on both ends that hand-off cost more than the handling: in the 5,000-client
load test the client processes used more CPU than the server, and a third of the server's
CPU went to resuming per-connection handler tasks. Here each connection is an
:class:`asyncio.Protocol` that feeds bytes to websockets' :class:`~websockets.client.
ClientProtocol` or :class:`~websockets.server.ServerProtocol` (handshake, framing, limits,
ping/pong and the closing handshake all stay websockets' work) and calls a handler
synchronously from ``data_received`` for every complete data message, in order.

Client::

    conn = await ws_connect("ws://127.0.0.1:8765", on_message, open_timeout_s=10)
    conn.send(b"...")          # bytes: binary frame, str: text frame
    await conn.wait_closed()   # raises what on_message raised, if it raised

Server::

    server = await ws_serve(handler, "127.0.0.1", 8765, max_size=4096)
    ...                        # handler.on_open / on_message / on_close(conn)
    await server.close()

Rules both ends share: messages are delivered in order up to the peer's close frame (those
that arrived in the same read as it included), and nothing once this end started closing
(or websockets failed the connection); fragmented messages are reassembled; ``max_size`` bounds an
inbound message (websockets closes with 1009 past it); :meth:`WsConnection.close` starts
the closing handshake and aborts the transport if the peer has not finished it within
``close_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as ssl_module
from collections.abc import Callable
from typing import Any, Protocol

from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import Protocol as SansIOProtocol
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from .wire import MAX_CLOSE_REASON_BYTES, clip_utf8

__all__ = ["ServerHandler", "WsClientConnection", "WsConnection", "WsServer",
           "WsServerConnection", "ws_connect", "ws_serve"]

log = logging.getLogger("flashnpc.server_sync")

OnMessage = Callable[[bytes | str], None]


class WsConnection(asyncio.Protocol):
    """What client and server connections share: writing, sending, closing, reassembly."""

    protocol: SansIOProtocol

    def __init__(self, close_timeout_s: float) -> None:
        self.close_timeout_s = close_timeout_s
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = self.loop.create_future()
        self._fragments: list[bytes] = []
        self._fragment_text = False
        self._close_timer: asyncio.TimerHandle | None = None
        self._closing = False  # this end started the closing handshake

    # ---- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.protocol.receive_data(data)
        events = self.protocol.events_received()
        self._write()
        for event in events:
            if not isinstance(event, Frame):
                self.on_handshake(event)
                continue
            if event.opcode is Opcode.CLOSE:
                return  # the peer's close: it sent nothing after it
            if self._closing or self.protocol.state not in (State.OPEN, State.CLOSING):
                return  # this end is closing: nothing more is handled
            try:
                message = self._assemble(event)
            except UnicodeDecodeError as exc:
                self.on_invalid_text(f"invalid UTF-8 in a text frame at byte {exc.start}")
                return
            if message is not None:
                self.on_message(message)

    def eof_received(self) -> None:
        self.protocol.receive_eof()
        self._write()

    def connection_lost(self, exc: Exception | None) -> None:
        self.protocol.receive_eof()
        if self._close_timer is not None:
            self._close_timer.cancel()
        if not self.closed.done():
            self.closed.set_result(None)

    # ---- hooks -----------------------------------------------------------------------------
    def on_message(self, message: bytes | str) -> None:
        raise NotImplementedError

    def on_handshake(self, event: Request | Response) -> None:
        raise NotImplementedError

    def on_invalid_text(self, reason: str) -> None:
        """A text message was not valid UTF-8 (RFC 6455 section 8.1): close with 1007."""
        self.close(1007, reason)

    # ---- frames ----------------------------------------------------------------------------
    def _assemble(self, frame: Frame) -> bytes | str | None:
        op = frame.opcode
        if op is Opcode.TEXT or op is Opcode.BINARY:
            if frame.fin:
                return frame.data.decode() if op is Opcode.TEXT else bytes(frame.data)
            self._fragments, self._fragment_text = [bytes(frame.data)], op is Opcode.TEXT
        elif op is Opcode.CONT and self._fragments:
            self._fragments.append(bytes(frame.data))
            if frame.fin:
                data, self._fragments = b"".join(self._fragments), []
                return data.decode() if self._fragment_text else data
        return None  # control frames: websockets has answered them already

    def _write(self) -> None:
        t = self.transport
        if t is None:
            return
        for data in self.protocol.data_to_send():
            if data:
                t.write(data)
            elif t.can_write_eof():
                with contextlib.suppress(OSError, RuntimeError):
                    t.write_eof()
            else:
                t.close()
        if self.protocol.close_expected() and self._close_timer is None:
            self._close_timer = self.loop.call_later(self.close_timeout_s, self.abort)

    # ---- API -------------------------------------------------------------------------------
    @property
    def open(self) -> bool:
        return self.protocol.state is State.OPEN

    def send(self, message: bytes | str) -> None:
        """Queue ``message`` (bytes: binary frame, str: text frame); ConnectionClosed if
        the connection is not open."""
        if self.protocol.state is not State.OPEN:
            p = self.protocol
            raise ConnectionClosed(p.close_rcvd, p.close_sent, p.close_rcvd_then_sent)
        if isinstance(message, str):
            self.protocol.send_text(message.encode())
        else:
            self.protocol.send_binary(message)
        self._write()

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Start the closing handshake (the transport is aborted if the peer has not
        finished it within ``close_timeout_s``); a no-op unless the connection is open.
        ``reason`` is cut to 123 bytes of UTF-8 on a character boundary (a close frame's
        payload is at most 125 bytes)."""
        if self.protocol.state is State.OPEN:
            self._closing = True
            self.protocol.send_close(code, clip_utf8(reason, MAX_CLOSE_REASON_BYTES))
            self._write()

    def abort(self) -> None:
        """Drop the TCP connection at once (no closing handshake)."""
        if self.transport is not None:
            self.transport.abort()

    @property
    def write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport is not None else 0


# ---- client --------------------------------------------------------------------------------

class WsClientConnection(WsConnection):
    """One client connection; ``on_message`` is the caller's callback (see the module
    docstring). An exception from it aborts the connection and is raised by
    :meth:`wait_closed`."""

    def __init__(self, url: str, on_message: OnMessage, *, max_size: int | None = None,
                 close_timeout_s: float = 2.0) -> None:
        super().__init__(close_timeout_s)
        self.protocol = ClientProtocol(parse_uri(url), max_size=max_size)
        self._callback = on_message
        self.opened: asyncio.Future[None] = self.loop.create_future()
        self._error: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert isinstance(self.protocol, ClientProtocol)
        self.protocol.send_request(self.protocol.connect())
        self._write()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self.opened.done():
            assert isinstance(self.protocol, ClientProtocol)
            self.opened.set_exception(self.protocol.handshake_exc
                                      or ConnectionError("connection lost during the handshake"))
            self.opened.exception()  # retrieved: a caller that timed out need not look

    def on_handshake(self, event: Request | Response) -> None:
        assert isinstance(self.protocol, ClientProtocol)
        if self.opened.done():
            return
        if self.protocol.handshake_exc is not None:
            self.opened.set_exception(self.protocol.handshake_exc)
            self.abort()
        else:
            self.opened.set_result(None)

    def on_message(self, message: bytes | str) -> None:
        try:
            self._callback(message)
        except Exception as exc:  # the callback refused the message: drop the connection
            self._error = exc
            self.abort()

    async def wait_closed(self) -> None:
        """Wait until the connection is gone; raise what ``on_message`` raised, if any."""
        await asyncio.shield(self.closed)
        if self._error is not None:
            raise self._error


async def ws_connect(url: str, on_message: OnMessage, *, open_timeout_s: float | None = 10.0,
                     max_size: int | None = None,
                     ssl: ssl_module.SSLContext | None = None) -> WsClientConnection:
    """Open a connection to ``url`` (``ws://`` or ``wss://``) and complete the handshake.
    Raises OSError (cannot connect), InvalidHandshake (refused) or TimeoutError."""
    uri = parse_uri(url)
    loop = asyncio.get_running_loop()
    if uri.secure and ssl is None:
        ssl = ssl_module.create_default_context()
    made: list[WsClientConnection] = []

    def factory() -> WsClientConnection:
        made.append(WsClientConnection(url, on_message, max_size=max_size))
        return made[-1]

    async def open_() -> None:
        await loop.create_connection(factory, uri.host, uri.port, ssl=ssl if uri.secure else None,
                                     server_hostname=uri.host if uri.secure else None)
        await made[-1].opened

    try:
        await asyncio.wait_for(open_(), open_timeout_s)
    except BaseException:
        for conn in made:
            conn.abort()
        raise
    return made[-1]


# ---- server --------------------------------------------------------------------------------

class ServerHandler(Protocol):
    """What a server built on :func:`ws_serve` implements. All are called on the loop
    thread, synchronously; ``on_close`` only for connections that were opened.
    ``on_invalid_text`` (a text message that is not UTF-8) must close the connection with
    1007 (``conn.close(1007, reason)``), after whatever the server says first."""

    def on_open(self, conn: WsServerConnection) -> None: ...
    def on_message(self, conn: WsServerConnection, message: bytes | str) -> None: ...
    def on_invalid_text(self, conn: WsServerConnection, reason: str) -> None: ...
    def on_close(self, conn: WsServerConnection) -> None: ...


class WsServerConnection(WsConnection):
    """One accepted connection. ``state`` is the handler's own per-connection slot."""

    def __init__(self, server: WsServer) -> None:
        super().__init__(server.close_timeout_s)
        self.protocol = ServerProtocol(max_size=server.max_size)
        self.server = server
        self.state: Any = None
        self.opened = False
        self.last_recv = self.loop.time()
        self.ping_sent_at: float | None = None
        self._open_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._open_timer = self.loop.call_later(self.server.open_timeout_s, self.abort)
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.last_recv = self.loop.time()
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._open_timer is not None:
            self._open_timer.cancel()
        self.server.connections.discard(self)
        if self.opened:
            self.opened = False
            self._call(self.server.handler.on_close)

    def on_handshake(self, event: Request | Response) -> None:
        assert isinstance(self.protocol, ServerProtocol) and isinstance(event, Request)
        response = self.protocol.accept(event)
        self.protocol.send_response(response)
        self._write()
        if self._open_timer is not None:
            self._open_timer.cancel()
            self._open_timer = None
        if self.protocol.state is State.OPEN:
            self.opened = True
            self._call(self.server.handler.on_open)

    def on_message(self, message: bytes | str) -> None:
        self._call(self.server.handler.on_message, message)

    def on_invalid_text(self, reason: str) -> None:
        hook = getattr(self.server.handler, "on_invalid_text", None)
        if hook is None:
            super().on_invalid_text(reason)
        else:
            self._call(hook, reason)

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(self, *args)
        except Exception:  # a handler bug must cost this connection, not the server
            log.exception("connection handler failed")
            self.abort()


class WsServer:
    """The listening side of :func:`ws_serve`: its connections, keepalive and shutdown."""

    def __init__(self, handler: ServerHandler, *, max_size: int | None, open_timeout_s: float,
                 close_timeout_s: float, ping_interval_s: float | None,
                 ping_timeout_s: float) -> None:
        self.handler = handler
        self.max_size = max_size
        self.open_timeout_s = open_timeout_s
        self.close_timeout_s = close_timeout_s
        self.ping_interval_s = ping_interval_s
        self.ping_timeout_s = ping_timeout_s
        self.connections: set[WsServerConnection] = set()
        self.server: asyncio.AbstractServer | None = None
        self._keepalive: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def _keepalive_loop(self, interval: float) -> None:
        """A connection silent for ``interval`` gets a ping; one that has not answered a ping
        (nor sent anything) within ``ping_timeout_s`` of it is dropped."""
        while True:
            await asyncio.sleep(interval)
            now = asyncio.get_running_loop().time()
            for conn in list(self.connections):
                sent = conn.ping_sent_at
                if sent is not None and conn.last_recv < sent:  # a ping is out, unanswered
                    if now - sent > self.ping_timeout_s:
                        conn.abort()
                elif now - conn.last_recv > interval and conn.open:
                    conn.protocol.send_ping(b"")
                    conn._write()
                    conn.ping_sent_at = now

    async def close(self) -> None:
        """Stop listening, close every connection (closing handshake, then abort after
        ``close_timeout_s``) and wait until they are gone."""
        if self._keepalive is not None:
            self._keepalive.cancel()
        if self.server is not None:
            self.server.close()
        conns = list(self.connections)
        for conn in conns:
            conn.close(1001, "server shutdown")
            if not conn.opened:
                conn.abort()
        if conns:
            await asyncio.wait([asyncio.shield(c.closed) for c in conns],
                               timeout=self.close_timeout_s + 1.0)
        for conn in conns:
            conn.abort()


async def ws_serve(handler: ServerHandler, host: str, port: int, *, max_size: int | None = 2**20,
                   backlog: int = 100, open_timeout_s: float = 10.0, close_timeout_s: float = 2.0,
                   ping_interval_s: float | None = 20.0, ping_timeout_s: float = 20.0) -> WsServer:
    """Listen on ``host:port`` (0: any free port, see :attr:`WsServer.port`)."""
    ws = WsServer(handler, max_size=max_size, open_timeout_s=open_timeout_s,
                  close_timeout_s=close_timeout_s, ping_interval_s=ping_interval_s,
                  ping_timeout_s=ping_timeout_s)
    loop = asyncio.get_running_loop()
    ws.server = await loop.create_server(lambda: WsServerConnection(ws), host, port,
                                         backlog=backlog)
    if ping_interval_s:
        ws._keepalive = loop.create_task(ws._keepalive_loop(ping_interval_s))
    return ws
