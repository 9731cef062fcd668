"""Dialogue over real WebSockets on 127.0.0.1, served by a tiny random model: sessions, lines,
streaming, errors that keep the connection, limits that close it, busy, health and metrics."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.request
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from runtime.serving.dialogue_service import CircuitBreaker
from server_sync.dialogue.dialogue_protocol import (
    decode_dialogue_server,
    validate_dialogue_client,
)
from server_sync.dialogue.dialogue_server import DialogueConfig, DialogueServer
from server_sync.transport.wire import ProtocolError, encode
from tests.server_sync.conftest import SECRET, token, until

from .conftest import cat, make_service


class Peer:
    """A test client: sends dicts, receives validated server messages."""

    def __init__(self, ws: Any, codec: str = "json") -> None:
        self.ws, self.codec = ws, codec

    async def send(self, msg: dict[str, Any]) -> None:
        await self.ws.send(encode(msg, self.codec))

    async def recv(self) -> dict[str, Any]:
        msg, _ = decode_dialogue_server(await asyncio.wait_for(self.ws.recv(), 30))
        return msg

    async def until(self, t: str, rid: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Messages up to the first of type ``t`` for ``rid``; returns it and those before."""
        seen = []
        while True:
            m = await self.recv()
            if m["t"] == t and m.get("rid") == rid:
                return m, seen
            seen.append(m)


async def hello(port: int, player: str = "alice", codec: str = "json") -> Peer:
    ws = await connect(f"ws://127.0.0.1:{port}", max_size=2**20)
    peer = Peer(ws, codec)
    await peer.send({"t": "hello", "v": 1, "token": token(player)})
    welcome = await peer.recv()
    assert welcome == {"t": "welcome", "v": 1, "player": player}
    return peer


@pytest.fixture
async def server(loaded: Any) -> Any:
    srv = DialogueServer(make_service(loaded), DialogueConfig(secret=SECRET, port=0, http_port=0))
    await srv.start()
    yield srv
    await srv.stop()


async def open_session(peer: Peer, loaded: Any, rid: int, **extra: Any) -> str:
    await peer.send({"t": "open_session", "rid": rid, "archetype": cat(loaded, "archetypes"),
                     "state": cat(loaded, "states"), **extra})
    reply, _ = await peer.until("session", rid)
    return reply["session"]


async def test_a_session_gets_lines_streamed_or_whole_and_its_state_can_change(server, loaded):
    for codec in ("json", "msgpack"):
        peer = await hello(server.port, codec=codec)
        sid = await open_session(peer, loaded, 1)
        await peer.send({"t": "request_line", "rid": 2, "session": sid,
                         "intent": cat(loaded, "intents"), "seed": 3, "max_tokens": 8})
        whole, before = await peer.until("line", 2)
        assert before == [] and whole["session"] == sid and whole["text"]
        await peer.send({"t": "request_line", "rid": 3, "session": sid, "stream": True,
                         "intent": cat(loaded, "intents"), "seed": 3, "max_tokens": 8})
        streamed, pieces = await peer.until("line", 3)
        assert all(p["t"] == "piece" and p["rid"] == 3 for p in pieces)
        if not streamed["fallback"]:
            assert "".join(p["text"] for p in pieces) == streamed["text"]
            assert streamed["text"] == whole["text"]  # same seed, same line
        await peer.send({"t": "update_state", "rid": 4, "session": sid,
                         "state": cat(loaded, "states", 1)})
        assert (await peer.until("ok", 4))[0] == {"t": "ok", "rid": 4}
        assert server.service.session(sid).state == cat(loaded, "states", 1)
        await peer.send({"t": "close_session", "rid": 5, "session": sid})
        await peer.until("ok", 5)
        await peer.ws.close()


async def test_bad_values_and_unknown_sessions_get_request_errors_and_the_connection_stays(
        server, loaded):
    peer = await hello(server.port)
    await peer.send({"t": "open_session", "rid": 1, "archetype": "dragon",
                     "state": cat(loaded, "states")})
    err, _ = await peer.until("error", 1)
    assert err["code"] == "invalid_request" and "dragon" in err["reason"]
    sid = await open_session(peer, loaded, 2)
    await peer.send({"t": "update_state", "rid": 3, "session": sid, "state": "dancing"})
    assert (await peer.until("error", 3))[0]["code"] == "invalid_request"
    await peer.send({"t": "request_line", "rid": 4, "session": "nope", "intent": "greet"})
    assert (await peer.until("error", 4))[0]["code"] == "unknown_session"
    other = await hello(server.port, "bob")  # sessions are private to their connection
    await other.send({"t": "request_line", "rid": 1, "session": sid,
                      "intent": cat(loaded, "intents")})
    assert (await other.until("error", 1))[0]["code"] == "unknown_session"
    await peer.send({"t": "request_line", "rid": 5, "session": sid,
                     "intent": cat(loaded, "intents"), "max_tokens": 4})
    assert (await peer.until("line", 5))[0]["session"] == sid
    await peer.ws.close()
    await other.ws.close()


async def closed_with(peer: Peer, code: str) -> None:
    err = await peer.recv()
    assert err["t"] == "error" and err["code"] == code and "rid" not in err
    with pytest.raises(ConnectionClosed):
        await peer.recv()


async def test_auth_schema_and_size_violations_close_the_connection(server, loaded):
    ws = await connect(f"ws://127.0.0.1:{server.port}")
    peer = Peer(ws)
    await peer.send({"t": "hello", "v": 1, "token": "forged.token"})
    await closed_with(peer, "auth_failed")

    peer = Peer(await connect(f"ws://127.0.0.1:{server.port}"))
    await peer.send({"t": "open_session", "rid": 1, "archetype": "a", "state": "b"})
    await closed_with(peer, "not_authenticated")

    peer = await hello(server.port)
    await peer.send({"t": "request_line", "rid": 1, "session": "s", "intent": "greet",
                     "deadline_ms": "soon"})
    await closed_with(peer, "bad_message")

    peer = await hello(server.port)
    await peer.ws.send("x" * (server.config.max_frame + 1))
    with pytest.raises(ConnectionClosed) as info:
        await peer.recv()
    assert info.value.rcvd is not None and info.value.rcvd.code == 1009


async def test_schema_names_the_offending_field():
    with pytest.raises(ProtocolError, match="request_line: 'max_tokens' must be <= 256"):
        validate_dialogue_client({"t": "request_line", "rid": 1, "session": "s",
                                  "intent": "greet", "max_tokens": 1000})
    with pytest.raises(ProtocolError, match="update_state: needs 'state', 'persona' or 'context'"):
        validate_dialogue_client({"t": "update_state", "rid": 1, "session": "s"})
    with pytest.raises(ProtocolError, match="unknown field"):
        validate_dialogue_client({"t": "close_session", "rid": 1, "session": "s", "x": 1})


async def test_flooding_past_the_rate_limit_closes_with_rate_limited(loaded):
    cfg = DialogueConfig(secret=SECRET, port=0, http_port=None, rate_per_s=1.0, rate_burst=3.0)
    async with DialogueServer(make_service(loaded), cfg) as srv:
        peer = await hello(srv.port)
        for rid in range(1, 6):
            await peer.send({"t": "close_session", "rid": rid, "session": "none"})
        codes = []
        with pytest.raises(ConnectionClosed):
            while True:
                codes.append((await peer.recv())["code"])
        assert codes[:3] == ["unknown_session"] * 3 and codes[3] == "rate_limited"


async def test_requests_past_the_in_flight_limit_are_answered_busy(loaded):
    cfg = DialogueConfig(secret=SECRET, port=0, http_port=None, max_inflight_per_conn=1)
    async with DialogueServer(make_service(loaded), cfg) as srv:
        peer = await hello(srv.port)
        sid = await open_session(peer, loaded, 1)
        rids = list(range(2, 8))
        for r in rids:
            await peer.send({"t": "request_line", "rid": r, "session": sid,
                             "intent": cat(loaded, "intents"), "max_tokens": 24})
        answers: dict[int, str] = {}
        while len(answers) < len(rids):
            m = await peer.recv()
            assert m["rid"] not in answers
            answers[m["rid"]] = m["t"]
        assert answers[2] == "line" and "busy" in answers.values()
        assert set(answers.values()) <= {"line", "busy"}


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


async def test_health_reports_the_open_breaker_and_metrics_merge_the_service(loaded):
    breaker = CircuitBreaker(p95_budget_ms=1e-6, min_requests=1, cooldown_s=3600)
    svc = make_service(loaded, breaker=breaker)
    async with DialogueServer(svc, DialogueConfig(secret=SECRET, port=0, http_port=0)) as srv:
        base = f"http://127.0.0.1:{srv.http_port}"
        status, body = await asyncio.to_thread(get, base + "/health")
        assert status == 200 and json.loads(body)["status"] == "ready"
        peer = await hello(srv.port)
        sid = await open_session(peer, loaded, 1)
        for rid in (2, 3):
            await peer.send({"t": "request_line", "rid": rid, "session": sid,
                             "intent": cat(loaded, "intents"), "max_tokens": 4})
            line, _ = await peer.until("line", rid)
        assert line["fallback"] and line["fallback_reason"] == "breaker_open"
        status, body = await asyncio.to_thread(get, base + "/health")
        health = json.loads(body)
        assert status == 503 and health["status"] == "degraded"
        assert health["service"]["breaker"]["state"] == "open"
        status, body = await asyncio.to_thread(get, base + "/metrics")
        text = body.decode()
        assert status == 200 and "flashnpc_dialogue_lines_total 2.0" in text
        assert "flashnpc_breaker_state" in text and "flashnpc_dialogue_sessions" in text
        await peer.ws.close()


async def test_two_hundred_sessions_on_twenty_connections_all_get_lines_and_close_on_leave(
        server, loaded):
    n_conns, per_conn = 20, 10

    async def player(i: int) -> list[dict[str, Any]]:
        peer = await hello(server.port, f"p{i}", codec="msgpack" if i % 2 else "json")
        sids = [await open_session(peer, loaded, k + 1) for k in range(per_conn)]
        for k, sid in enumerate(sids):
            await peer.send({"t": "request_line", "rid": 100 + k, "session": sid, "seed": k,
                             "intent": cat(loaded, "intents", k % 3), "max_tokens": 6,
                             "stream": k % 2 == 0})
        # lines come in the order they finish (a resampled one comes later), not as requested
        lines: dict[int, dict[str, Any]] = {}
        while len(lines) < per_conn:
            m = await peer.recv()
            if m["t"] == "line":
                lines[m["rid"]] = m
        await peer.ws.close()
        return [lines[100 + k] for k in range(per_conn)]

    results = await asyncio.gather(*[player(i) for i in range(n_conns)])
    lines = [x for r in results for x in r]
    assert len(lines) == n_conns * per_conn
    assert len({x["session"] for x in lines}) == n_conns * per_conn
    await until(lambda: server.service.num_sessions == 0, what="sessions closed on leave")


async def test_a_client_that_does_not_read_is_dropped_as_slow_not_buffered_forever(loaded):
    cfg = DialogueConfig(secret=SECRET, port=0, http_port=None, max_outbound_bytes=8 * 1024,
                         rate_per_s=1000, rate_burst=1000)
    async with DialogueServer(make_service(loaded), cfg) as srv:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", srv.port))
        async with connect(f"ws://127.0.0.1:{srv.port}", sock=sock, max_queue=1,
                           compression=None, close_timeout=1) as ws:
            peer = Peer(ws)
            await peer.send({"t": "hello", "v": 1, "token": token("slow")})
            await until(lambda: len(srv.conns) == 1, what="slow client attached")
            conn = next(iter(srv.conns))
            conn.ws.transport.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            sid = await open_session(peer, loaded, 1)
            for rid in range(2, 400):  # each answer names every known state (~0.5 KB)
                await peer.send({"t": "update_state", "rid": rid, "session": sid,
                                 "state": "dancing"})
            await until(lambda: not srv.conns, 20, what="slow client dropped")
        assert srv.errors["slow_consumer"] == 1


async def test_a_rid_beyond_2_53_is_a_clear_bad_message_and_a_close(server):
    for rid in ("1000000000000000000000000000000", "9007199254740992"):
        peer = await hello(server.port)
        await peer.ws.send('{"t":"close_session","rid":' + rid + ',"session":"s"}')
        err = await peer.recv()
        assert err["code"] == "bad_message" and "'rid' must be <= 9007199254740991" in err["reason"]
        with pytest.raises(ConnectionClosed) as closed:
            await peer.recv()
        assert closed.value.rcvd.code == 1008


async def test_cancel_answers_the_request_once_with_cancelled_and_nothing_after(server, loaded):
    peer = await hello(server.port)
    sid = await open_session(peer, loaded, 1)
    await peer.send({"t": "cancel", "rid": 99})  # nothing in flight: ignored, no answer
    await peer.send({"t": "request_line", "rid": 7, "session": sid, "stream": True,
                     "intent": cat(loaded, "intents"), "max_tokens": 256, "deadline_ms": 30_000})
    await peer.send({"t": "cancel", "rid": 7})
    err, before = await peer.until("error", 7)
    assert err["code"] == "cancelled" and all(m["t"] == "piece" for m in before)
    await peer.send({"t": "request_line", "rid": 7, "session": sid,  # the rid is free again
                     "intent": cat(loaded, "intents"), "max_tokens": 4})
    line, between = await peer.until("line", 7)
    assert line["session"] == sid and between == []  # nothing more of the cancelled one
    await peer.send({"t": "close_session", "rid": 8, "session": sid})
    assert await peer.recv() == {"t": "ok", "rid": 8}
    await peer.ws.close()


async def test_every_dialogue_server_message_type_is_checked_against_its_schema(
        loaded, outbound_schema_check):
    cfg = DialogueConfig(secret=SECRET, port=0, http_port=None, max_inflight_per_conn=1)
    async with DialogueServer(make_service(loaded), cfg) as srv:
        peer = await hello(srv.port)
        sid = await open_session(peer, loaded, 1)
        for rid in (2, 3):
            await peer.send({"t": "request_line", "rid": rid, "session": sid, "stream": True,
                             "intent": cat(loaded, "intents"), "max_tokens": 8})
        await peer.until("line", 2)
        await peer.send({"t": "update_state", "rid": 4, "session": sid, "state": "dancing"})
        await peer.until("error", 4)
        await peer.send({"t": "close_session", "rid": 5, "session": sid})
        await peer.until("ok", 5)
        other = await hello(srv.port, "bob")
    got = {k.split(".")[1] for k in outbound_schema_check.checked if k.startswith("dialogue.")}
    assert {"welcome", "session", "line", "busy", "error", "ok", "bye"} <= got, got
    assert outbound_schema_check.violations == []
    for p in (peer, other):
        with pytest.raises(ConnectionClosed):
            while True:
                await p.recv()
