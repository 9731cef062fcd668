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

from server_sync import aio
from server_sync.ws_io import ws_connect

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
