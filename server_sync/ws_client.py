"""A thin asyncio layer over websockets' sans-I/O client protocol, for :class:`Client`.

``websockets.asyncio.client`` hands every message through a queue to a task that wakes up
to ``recv`` it. A game client receives a steady stream of small deltas and handles each one
in a few microseconds, so that hand-off was most of its CPU per message (the 5,000-client
load test spent more CPU in its client processes than the server spent serving them).
:class:`WsClientConnection` is an :class:`asyncio.Protocol` that feeds bytes to
:class:`websockets.client.ClientProtocol` (handshake, framing, ping/pong and the closing
handshake all stay websockets' work) and calls ``on_message`` synchronously from
``data_received`` for every complete data message, in order.

    conn = await ws_connect("ws://127.0.0.1:8765", on_message, open_timeout_s=10)
    conn.send(b"...")          # bytes: binary frame, str: text frame
    await conn.wait_closed()   # raises what on_message raised, if it raised

An exception from ``on_message`` aborts the connection and is raised by ``wait_closed``.
Fragmented messages are reassembled; ``max_size`` bounds a message (None: no bound).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl as ssl_module
from collections.abc import Callable

from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.uri import parse_uri

__all__ = ["WsClientConnection", "ws_connect"]

OnMessage = Callable[[bytes | str], None]


class WsClientConnection(asyncio.Protocol):
    """One client WebSocket connection; see the module docstring."""

    def __init__(self, url: str, on_message: OnMessage, *, max_size: int | None = None,
                 close_timeout_s: float = 2.0) -> None:
        self.protocol = ClientProtocol(parse_uri(url), max_size=max_size)
        self.on_message = on_message
        self.close_timeout_s = close_timeout_s
        self.transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[None] = loop.create_future()
        self._closed: asyncio.Future[None] = loop.create_future()
        self._error: BaseException | None = None
        self._fragments: list[bytes] = []
        self._fragment_text = False
        self._close_timer: asyncio.TimerHandle | None = None

    # ---- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self.protocol.send_request(self.protocol.connect())
        self._write()

    def data_received(self, data: bytes) -> None:
        self.protocol.receive_data(data)
        events = self.protocol.events_received()
        self._write()
        try:
            for event in events:
                if isinstance(event, Frame):
                    self._on_frame(event)
                elif isinstance(event, Response):
                    self._on_response()
        except Exception as exc:  # on_message refused the message: drop the connection
            self._error = exc
            self.abort()

    def eof_received(self) -> None:
        self.protocol.receive_eof()
        self._write()

    def connection_lost(self, exc: Exception | None) -> None:
        self.protocol.receive_eof()
        if self._close_timer is not None:
            self._close_timer.cancel()
        if not self.opened.done():
            self.opened.set_exception(self.protocol.handshake_exc
                                      or ConnectionError("connection lost during the handshake"))
            self.opened.exception()  # retrieved: a caller that timed out need not look
        if not self._closed.done():
            self._closed.set_result(None)

    # ---- events ----------------------------------------------------------------------------
    def _on_response(self) -> None:
        if self.opened.done():
            return
        if self.protocol.handshake_exc is not None:
            self.opened.set_exception(self.protocol.handshake_exc)
            self.abort()
        else:
            self.opened.set_result(None)

    def _on_frame(self, frame: Frame) -> None:
        op = frame.opcode
        if op is Opcode.TEXT or op is Opcode.BINARY:
            if frame.fin:
                self.on_message(frame.data.decode() if op is Opcode.TEXT else bytes(frame.data))
            else:
                self._fragments, self._fragment_text = [bytes(frame.data)], op is Opcode.TEXT
        elif op is Opcode.CONT and self._fragments:
            self._fragments.append(bytes(frame.data))
            if frame.fin:
                data, self._fragments = b"".join(self._fragments), []
                self.on_message(data.decode() if self._fragment_text else data)

    # ---- sending ---------------------------------------------------------------------------
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
            self._close_timer = asyncio.get_running_loop().call_later(
                self.close_timeout_s, self.abort)

    @property
    def open(self) -> bool:
        return self.protocol.state is State.OPEN

    def send(self, message: bytes | str) -> None:
        """Queue ``message`` (bytes: binary frame, str: text frame); ConnectionClosed if
        the connection is not open."""
        if self.protocol.state is not State.OPEN:
            raise ConnectionClosed(self.protocol.close_rcvd, self.protocol.close_sent)
        if isinstance(message, str):
            self.protocol.send_text(message.encode())
        else:
            self.protocol.send_binary(message)
        self._write()

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Start the closing handshake (the transport is aborted if the server does not
        answer within ``close_timeout_s``)."""
        if self.protocol.state is State.OPEN:
            self.protocol.send_close(code, reason)
            self._write()

    def abort(self) -> None:
        """Drop the TCP connection at once (no closing handshake)."""
        if self.transport is not None:
            self.transport.abort()

    async def wait_closed(self) -> None:
        """Wait until the connection is gone; raise what ``on_message`` raised, if any."""
        await asyncio.shield(self._closed)
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
