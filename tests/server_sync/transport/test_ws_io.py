"""The sans-I/O client connection over real websockets servers on loopback, on both loops."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.http11 import Response

from server_sync.transport import aio
from server_sync.transport.ws_io import WsServerConnection, ws_connect, ws_serve

LOOPS = [pytest.param("asyncio"),
         pytest.param("uvloop", marks=pytest.mark.skipif(aio.loop_name("auto") != "uvloop",
                                                         reason="uvloop not installed"))]


def on_loop(loop: str, main: Callable[[], Awaitable[Any]]) -> Any:
    return aio.run(main(), loop=loop)  # type: ignore[arg-type]


async def echo(ws: ServerConnection) -> None:
    async for m in ws:
        if m == "fragments":
            await ws.send(["frag", "mented"])  # one message in three frames
        else:
            await ws.send(m)


async def until(cond: Callable[[], bool]) -> None:
    while not cond():
        await asyncio.sleep(0)


@pytest.mark.parametrize("loop", LOOPS)
def test_messages_arrive_in_order_with_their_frame_type(loop: str) -> None:
    async def main() -> list[bytes | str]:
        async with serve(echo, "127.0.0.1", 0) as srv:
            got: list[bytes | str] = []
            c = await ws_connect(f"ws://127.0.0.1:{srv.sockets[0].getsockname()[1]}",
                                 got.append)
            for i in range(50):
                c.send(b"b%d" % i if i % 2 else f"t{i}")
            c.send("fragments")
            await until(lambda: len(got) == 51)
            c.close()
            await c.wait_closed()
            assert not c.open
            return got

    got = on_loop(loop, main)
    assert got[:50] == [b"b%d" % i if i % 2 else f"t{i}" for i in range(50)]
    assert got[50] == "fragmented"


@pytest.mark.parametrize("loop", LOOPS)
def test_an_exception_in_on_message_drops_the_connection_and_is_raised(loop: str) -> None:
    def refuse(message: bytes | str) -> None:
        raise ValueError(f"cannot handle {message!r}")

    async def main() -> None:
        async with serve(echo, "127.0.0.1", 0) as srv:
            c = await ws_connect(f"ws://127.0.0.1:{srv.sockets[0].getsockname()[1]}", refuse)
            c.send(b"x")
            with pytest.raises(ValueError, match="cannot handle b'x'"):
                await c.wait_closed()
            with pytest.raises(ConnectionClosed):
                c.send(b"after")

    on_loop(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_refused_handshake_raises_invalid_handshake(loop: str) -> None:
    def forbid(ws: ServerConnection, request: Any) -> Response:
        return Response(403, "Forbidden", Headers([("Content-Length", "0")]), b"")

    async def main() -> None:
        async with serve(echo, "127.0.0.1", 0, process_request=forbid) as srv:
            with pytest.raises(InvalidHandshake):
                await ws_connect(f"ws://127.0.0.1:{srv.sockets[0].getsockname()[1]}",
                                 print, open_timeout_s=5)

    on_loop(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_server_that_never_answers_times_out(loop: str) -> None:
    async def main() -> None:
        with (socket.create_server(("127.0.0.1", 0)) as silent,  # accepts, never replies
              pytest.raises(asyncio.TimeoutError)):
            await ws_connect(f"ws://127.0.0.1:{silent.getsockname()[1]}", print,
                             open_timeout_s=0.2)

    on_loop(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_nothing_listening_raises_oserror(loop: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed again: nothing listens there

    async def main() -> None:
        with pytest.raises(OSError):
            await ws_connect(f"ws://127.0.0.1:{port}", print, open_timeout_s=5)

    on_loop(loop, main)


class Recorder:
    """A ServerHandler that echoes, fails on b"boom" and records what it saw."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_open(self, conn: WsServerConnection) -> None:
        self.events.append(("open", None))

    def on_message(self, conn: WsServerConnection, message: bytes | str) -> None:
        if message == b"boom":
            raise RuntimeError("handler bug")
        self.events.append(("message", message))
        conn.send(message)

    def on_close(self, conn: WsServerConnection) -> None:
        self.events.append(("close", None))


@pytest.mark.parametrize("loop", LOOPS)
def test_server_echoes_in_order_and_a_handler_bug_costs_only_that_connection(loop: str) -> None:
    async def main() -> None:
        h = Recorder()
        server = await ws_serve(h, "127.0.0.1", 0, ping_interval_s=None)
        url = f"ws://127.0.0.1:{server.port}"
        got_a: list[bytes | str] = []
        got_b: list[bytes | str] = []
        a = await ws_connect(url, got_a.append)
        b = await ws_connect(url, got_b.append)
        for i in range(20):
            a.send(b"%d" % i)
        b.send(b"boom")
        await b.wait_closed()
        a.send("still here")
        await until(lambda: len(got_a) == 21)
        assert got_a == [b"%d" % i for i in range(20)] + ["still here"]
        assert ("close", None) in h.events  # b's close reached the handler
        await server.close()
        await a.wait_closed()
        assert h.events.count(("open", None)) == 2 and h.events.count(("close", None)) == 2

    on_loop(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_server_drops_a_connection_that_never_completes_the_handshake(loop: str) -> None:
    async def main() -> None:
        h = Recorder()
        server = await ws_serve(h, "127.0.0.1", 0, open_timeout_s=0.1, ping_interval_s=None)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        assert await reader.read() == b""  # the server hung up
        writer.close()
        assert h.events == []  # never opened, so never reported
        await server.close()

    on_loop(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_server_answers_a_plain_http_request_with_an_error_status(loop: str) -> None:
    async def main() -> bytes:
        server = await ws_serve(Recorder(), "127.0.0.1", 0, ping_interval_s=None)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = await reader.read()
        writer.close()
        await server.close()
        return reply

    assert on_loop(loop, main).startswith(b"HTTP/1.1 426")


@pytest.mark.parametrize("loop", LOOPS)
def test_keepalive_drops_a_peer_that_answers_no_ping(loop: str) -> None:
    async def main() -> None:
        h = Recorder()
        server = await ws_serve(h, "127.0.0.1", 0, ping_interval_s=0.05, ping_timeout_s=0.05)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     b"Sec-WebSocket-Version: 13\r\n\r\n")
        data = await reader.read()  # handshake, a ping, then EOF: it never sends a pong
        writer.close()
        assert data.startswith(b"HTTP/1.1 101")
        assert b"\x89\x00" in data  # the unanswered ping
        assert h.events == [("open", None), ("close", None)]
        await server.close()

    on_loop(loop, main)
