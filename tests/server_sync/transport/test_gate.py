"""The connection gate under hostile input (issue #15): every bad frame gets an error frame and a
close code, never a traceback; tokens end with bye and at their exp; admin auth on bytes."""

import asyncio
import logging
import socket

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from server_sync.sync.protocol import decode_client, decode_server
from server_sync.transport.gate import GateConfig, GatedServer
from server_sync.transport.wire import MAX_CLOSE_REASON_BYTES, clip_utf8, encode

from ..conftest import SECRET, raw, token


@pytest.fixture(autouse=True)
def no_tracebacks(caplog):
    """A gate test fails if anything logged a traceback."""
    caplog.set_level(logging.WARNING)
    yield
    assert [r for r in caplog.records if r.exc_info] == []


def hello(player="alice", codec="msgpack", **kw):
    return encode({"t": "hello", "v": 1, "token": token(player, **kw)}, codec)


@pytest.mark.parametrize("text", ["é" * 120, "😀" * 60, "語" * 90, "a" * 500],
                         ids=["2-byte", "4-byte", "3-byte", "ascii"])
def test_a_close_reason_is_cut_to_123_bytes_on_a_character_boundary(text):
    cut = clip_utf8(f"bad_message: {text}", MAX_CLOSE_REASON_BYTES)
    assert len(cut.encode()) <= 123 and f"bad_message: {text}".startswith(cut)
    assert len(cut.encode()) > 123 - 4  # no more cut than one character


@pytest.mark.parametrize("echo", ["é" * 200, "😀" * 200, "語" * 200],
                         ids=["2-byte", "4-byte", "3-byte"])
async def test_a_close_reason_echoing_multibyte_client_text_still_closes_cleanly(server, echo):
    got, close = await raw(server.port, [hello(), encode({"t": echo}, "msgpack")])
    assert [m["code"] for m in got if m["t"] == "error"] == ["bad_message"]
    assert close is not None and close.code == 1008  # not 1006: the close frame was valid
    assert close.reason.startswith("bad_message: ") and len(close.reason.encode()) <= 123


@pytest.mark.parametrize("frame", [
    '{"t":' + "[" * 2000 + "]" * 2000 + "}",  # deep JSON: RecursionError in the parser
    b"\x81\xa1t" + b"\x91" * 4000,              # deep msgpack
    '{"t": "intent", "cseq": 1, "pos": ' + "[" * 1500 + "]" * 1500 + "}",
], ids=["json-2000", "msgpack-4000", "json-in-a-field"])
async def test_deeply_nested_frames_get_bad_frame_or_bad_message_and_a_close(server, frame):
    got, close = await raw(server.port, [hello(codec="json" if isinstance(frame, str) else "msgpack"),
                                         frame])
    codes = [m["code"] for m in got if m["t"] == "error"]
    assert codes in (["bad_frame"], ["bad_message"]) and close.code == 1008


@pytest.mark.parametrize("authenticated", [False, True])
async def test_invalid_utf8_in_a_text_frame_gets_bad_frame_and_close_1007(server, authenticated):
    frames = [hello(codec="json")] if authenticated else []
    got, close = await raw(server.port, [*frames, b'{"t": "\xff\xfe"}'], text=True)
    errors = [m for m in got if m["t"] == "error"]
    assert [e["code"] for e in errors] == ["bad_frame"] and "UTF-8" in errors[0]["reason"]
    assert close.code == 1007 and close.reason.startswith("bad_frame")


@pytest.mark.parametrize("signature", ["é" * 43, "ÿþ", "\u2603" * 10])
async def test_a_non_ascii_token_signature_is_auth_failed_not_a_traceback(server, signature):
    head, body, _ = token("alice").split(".")
    forged = encode({"t": "hello", "v": 1, "token": f"{head}.{body}.{signature}"}, "json")
    got, close = await raw(server.port, [forged])
    assert [m["code"] for m in got if m["t"] == "error"] == ["auth_failed"]
    assert close.code == 1008


async def test_a_token_stops_working_after_bye(server):
    tok = token("alice")
    first = encode({"t": "hello", "v": 1, "token": tok}, "msgpack")
    got, close = await raw(server.port, [first, encode({"t": "bye"}, "msgpack")])
    assert got[0]["t"] == "snapshot" and close.code == 1000
    got, close = await raw(server.port, [first])
    assert [(m["code"], "bye" in m["reason"]) for m in got if m["t"] == "error"] == \
        [("auth_failed", True)]
    assert close.code == 1008
    got, _ = await asyncio.wait_for(raw(server.port, [hello("alice"), encode({"t": "bye"},
                                                                          "msgpack")]), 10)
    assert got[0]["t"] == "snapshot"  # a fresh token works


async def test_a_connection_is_closed_when_its_token_expires(server):
    async with connect(f"ws://127.0.0.1:{server.port}") as ws:
        await ws.send(hello("alice", ttl_s=1.5))
        errors = []
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                m = decode_server(await asyncio.wait_for(ws.recv(), 10))[0]
                if m["t"] == "error":
                    errors.append(m["code"])
        assert errors == ["token_expired"]
        assert closed.value.rcvd.code == 1008 and closed.value.rcvd.reason.startswith("token_expired")


async def http_raw(port, request: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    writer.close()
    return status


@pytest.mark.parametrize("bearer", ["é".encode(), "\u2603admin".encode(), b"\xff\xfe",
                                    b"wrong", b""])
async def test_admin_endpoints_answer_401_to_a_wrong_or_non_ascii_bearer_token_not_500(bearer):
    from server_sync import ServerConfig, SyncServer
    from server_sync.sync.world import sim_world

    async with SyncServer(sim_world(5), ServerConfig(secret=SECRET, port=0, http_port=0,
                                                     admin_token="adm")) as srv:
        for path in (b"/admin/stats", b"/admin/areas"):
            status = await http_raw(srv.http_port, b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n"
                                    b"Authorization: Bearer " + bearer + b"\r\n"
                                    b"Connection: close\r\n\r\n")
            assert status == 401
        ok = await http_raw(srv.http_port, b"GET /admin/stats HTTP/1.1\r\nHost: x\r\n"
                            b"Authorization: Bearer adm\r\nConnection: close\r\n\r\n")
        assert ok == 200


class Greeter(GatedServer):
    """A bare gated server (sync messages) whose welcome runs ``greet(server, conn)``."""

    schema_name = "sync"

    def __init__(self, greet, **config):
        super().__init__(GateConfig(secret=SECRET, **config))
        self.greet = greet

    def decode(self, frame):
        return decode_client(frame)

    def welcome(self, conn, hello):
        self.greet(self, conn)


async def greeted(greet, **config):
    """What a client gets from a :class:`Greeter`; (messages, close frame, server)."""
    srv = Greeter(greet, **config)
    await srv.listen()
    try:
        got, close = await raw(srv.port, [hello()])
    finally:
        await srv.close_all([])
    return got, close, srv


async def test_a_slow_consumer_hears_why_behind_its_backlog():
    """The error frame goes out behind the unsent bytes; the close follows it."""
    def flood(srv, conn):
        sock = conn.ws.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # the kernel takes little
        srv.write(conn, [encode({"t": "ack", "cseq": 0}, conn.codec)] * 20_000)

    got, close, srv = await greeted(flood, max_outbound_bytes=10_000)
    assert got[-1]["t"] == "error" and got[-1]["code"] == "slow_consumer"
    assert close.code == 1008 and srv.errors["slow_consumer"] == 1


async def test_no_server_frame_is_bigger_than_the_outbound_limit():
    """A frame the limit cannot hold closes the connection as slow_consumer, never goes out."""
    def big(srv, conn):
        srv.send(conn, {"t": "bye", "reason": "x" * 200})  # fits
        srv.write(conn, [encode({"t": "error", "code": "bad_frame", "reason": "y" * 800},
                                conn.codec)] * 30)  # fits only as separate frames
        srv.send(conn, {"t": "snapshot", "v": 1, "epoch": "e", "seq": 0, "time": 0.0,
                        "radius": 1.0, "tick_hz": 20.0, "pos": [0.0, 0.0],
                        "npcs": {f"n{k}": {"pos": [0.0, 0.0], "state": {"s": "z" * 100}}
                                 for k in range(200)}})  # ~25 KB in one frame

    got, close, _ = await greeted(big, max_outbound_bytes=20_000)
    assert [m["t"] for m in got[:1]] == ["bye"] and len(got) == 32
    assert got[-1]["code"] == "slow_consumer" and "over the server's outbound limit" in \
        got[-1]["reason"] and close.code == 1008
