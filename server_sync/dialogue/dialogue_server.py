"""Dialogue over WebSockets: :class:`DialogueServer` maps the messages of
:mod:`server_sync.dialogue.dialogue_protocol` onto a :class:`runtime.serving.dialogue_service.DialogueService`.

Connections run on :mod:`server_sync.transport.ws_io` behind the gate the sync server uses
(:mod:`server_sync.transport.gate`: hello with a valid token within ``hello_timeout_s``, 1009 size limit,
rate limit, schema validation, ``error`` + close on any violation, ``slow_consumer`` past
``max_outbound_bytes``). A connection may hold ``max_sessions_per_conn`` dialogue sessions and
``max_inflight_per_conn`` unanswered ``request_line`` messages (more get ``busy``); its
sessions close when it disconnects. Every request is answered exactly once (``handle``); a
``cancel`` answers its request at once with ``error cancelled``. Sessions are private to the connection that opened
them: another connection naming the id gets ``unknown_session``.

A request the service cannot take (queue full) is answered ``busy`` with the service's
``retry_after_ms``; anything the model has trouble with comes back as a ``line`` with
``fallback: true`` (the service never fails a valid request otherwise).

HTTP (aiohttp, ``http_port``): ``/health`` (200 ``ready`` or 503 ``degraded``, with each
model's breaker state under ``service.models``) and ``/metrics`` (the server's counters
followed by every model's registry, labelled ``model_name``, Prometheus text format).

Several models (:class:`runtime.serving.model_router.ModelRouter`): ``open_session`` may name
one (``model``, default ``base``; unknown: ``invalid_request`` listing the known ones) and mark
the session ``essential: false`` (the capacity rule may serve it by a fallback model or with
authored lines); the ``session`` reply names the model and every ``line`` says what produced
it (``served_by``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from runtime.serving.dialogue_service import Busy, DialogueLine, DialogueService, SessionNotFound
from runtime.serving.model_router import ModelRouter

from ..transport.gate import GateConfig, GateConn, GatedServer
from ..transport.wire import Codec
from ..transport.ws_io import WsServerConnection
from .dialogue_protocol import DIALOGUE_PROTOCOL_VERSION, decode_dialogue_client

__all__ = ["DialogueConfig", "DialogueServer"]

log = logging.getLogger("flashnpc.server_sync.dialogue")


@dataclass
class DialogueConfig(GateConfig):
    """The gate's settings (:class:`server_sync.transport.gate.GateConfig`) plus the dialogue limits."""

    port: int = 8767
    http_port: int | None = 8768
    max_sessions_per_conn: int = 64
    max_inflight_per_conn: int = 16
    worker_id: str | None = None  # sent in welcome's `worker` (behind a front: who holds the connection)


@dataclass(eq=False)
class _Conn(GateConn):
    """A dialogue connection: the gate's state plus its sessions and requests in flight."""

    sessions: set[str] = field(default_factory=set)
    inflight: dict[int, asyncio.Task[None]] = field(default_factory=dict)


class DialogueServer(GatedServer):
    """Serve ``service`` (already loaded; the server starts and closes it) per ``config``: a
    :class:`runtime.serving.model_router.ModelRouter` over several models, or one
    :class:`DialogueService`, served as the router's only model, ``base``."""

    protocol_name = "dialogue protocol"
    schema_name = "dialogue"
    protocol_version = DIALOGUE_PROTOCOL_VERSION

    def __init__(self, service: DialogueService | ModelRouter, config: DialogueConfig) -> None:
        super().__init__(config)
        self.service = service if isinstance(service, ModelRouter) else ModelRouter({"base": service})
        self.config: DialogueConfig = config
        self.conns: set[_Conn] = set()  # authenticated connections
        self.messages: Counter[str] = Counter()
        self.busy_total = 0
        self.lines_total = 0
        self.fallbacks_total = 0
        self._sid_prefix = f"d{id(self):x}-"
        self._next_sid = 0
        self._http_runner: Any = None
        self._gc_task: asyncio.Task[None] | None = None
        self.http_port: int | None = None

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        c = self.config
        await self.service.start()
        self.gc.start()
        self._gc_task = asyncio.get_running_loop().create_task(self._gc_loop())
        await self.listen()
        if c.http_port is not None:
            self._http_runner, self.http_port = await _start_http(self, c.host, c.http_port)

    async def _gc_loop(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            self.gc.step()

    async def stop(self) -> None:
        if self._gc_task is not None:
            self._gc_task.cancel()
        self.gc.stop()
        await self.close_all(self.conns)
        if self._http_runner is not None:
            await self._http_runner.cleanup()
        await self.service.close()

    async def __aenter__(self) -> DialogueServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def health(self) -> dict[str, Any]:
        """``degraded`` (with reasons) while any model's breaker is not closed."""
        svc = self.service.health()
        reasons = []
        for name, model in svc["models"].items():
            if model["status"] != "ok":
                b = model["breaker"]
                reasons.append(f"model {name}: dialogue breaker {b.get('state')}: "
                               f"{b.get('reason') or 'see breaker'}")
        return {"status": "degraded" if reasons else "ready", "reasons": reasons,
                "clients": len(self.conns), "service": svc}

    # ---- sending -------------------------------------------------------------------------
    def _send(self, conn: _Conn, msg: dict[str, Any]) -> None:
        self.send(conn, msg)

    def _request_error(self, conn: _Conn, rid: int, code: str, reason: str) -> None:
        self.errors[code] += 1
        self._send(conn, {"t": "error", "rid": rid, "code": code, "reason": reason[:800]})

    def _busy(self, conn: _Conn, rid: int, retry_after_ms: int) -> None:
        self.busy_total += 1
        self._send(conn, {"t": "busy", "rid": rid, "retry_after_ms": retry_after_ms})

    # ---- connections (the gate's hooks) --------------------------------------------------
    def decode(self, frame: bytes | str) -> tuple[dict[str, Any], Codec]:
        return decode_dialogue_client(frame)

    def new_conn(self, ws: WsServerConnection, timer: asyncio.TimerHandle) -> _Conn:
        return _Conn(ws, timer)

    def welcome(self, conn: GateConn, hello: dict[str, Any]) -> None:
        assert isinstance(conn, _Conn)
        self.conns.add(conn)
        welcome = {"t": "welcome", "v": DIALOGUE_PROTOCOL_VERSION, "player": conn.player}
        if self.config.worker_id is not None:
            welcome["worker"] = self.config.worker_id
        self._send(conn, welcome)

    def handle(self, conn: GateConn, msg: dict[str, Any]) -> None:
        """Every client message but hello/bye is answered exactly once, with its ``rid``:
        ``open_session``, ``update_state``, ``close_session`` at once; ``request_line`` when
        its line is done (or ``busy``/``error``); a ``cancel`` answers the cancelled request
        (``error cancelled``) and nothing else."""
        assert isinstance(conn, _Conn)
        t = msg["t"]
        self.messages[t] += 1
        if t == "open_session":
            self._open_session(conn, msg)
        elif t == "cancel":
            self._cancel(conn, msg["rid"])
        elif msg["session"] not in conn.sessions:
            self._request_error(conn, msg["rid"], "unknown_session",
                                f"{t}: no session {msg['session']!r} is open on this connection")
        elif t == "close_session":
            conn.sessions.discard(msg["session"])
            self.service.close_session(msg["session"])
            self._send(conn, {"t": "ok", "rid": msg["rid"]})
        elif t == "update_state":
            self._update_state(conn, msg)
        else:
            self._request_line(conn, msg)

    def bye(self, conn: GateConn) -> None:
        self.messages["bye"] += 1

    def closed(self, conn: GateConn) -> None:
        assert isinstance(conn, _Conn)
        self.conns.discard(conn)
        for task in conn.inflight.values():
            task.cancel()
        for sid in conn.sessions:
            with contextlib.suppress(SessionNotFound):
                self.service.close_session(sid)

    # ---- messages ------------------------------------------------------------------------
    def _open_session(self, conn: _Conn, msg: dict[str, Any]) -> None:
        rid = msg["rid"]
        if len(conn.sessions) >= self.config.max_sessions_per_conn:
            self._request_error(conn, rid, "too_many_sessions", f"at most "
                                f"{self.config.max_sessions_per_conn} sessions per connection")
            return
        self._next_sid += 1
        sid = f"{self._sid_prefix}{self._next_sid}"
        try:
            self.service.open_session(msg["archetype"], state=msg["state"],
                                      persona=msg.get("persona", ()),
                                      context=msg.get("context"), player_id=conn.player,
                                      session_id=sid, model=msg.get("model", "base"),
                                      essential=msg.get("essential", True))
        except Busy as exc:
            self._busy(conn, rid, exc.retry_after_ms)
            return
        except ValueError as exc:
            self._request_error(conn, rid, "invalid_request", f"open_session: {exc}")
            return
        conn.sessions.add(sid)
        self._send(conn, {"t": "session", "rid": rid, "session": sid,
                          "model": self.service.model_of(sid)})

    def _update_state(self, conn: _Conn, msg: dict[str, Any]) -> None:
        try:
            self.service.update_state(msg["session"], state=msg.get("state"),
                                      persona=msg.get("persona"), context=msg.get("context"))
        except ValueError as exc:
            self._request_error(conn, msg["rid"], "invalid_request", f"update_state: {exc}")
            return
        self._send(conn, {"t": "ok", "rid": msg["rid"]})

    def _request_line(self, conn: _Conn, msg: dict[str, Any]) -> None:
        rid = msg["rid"]
        if rid in conn.inflight:
            self._request_error(conn, rid, "duplicate_rid", f"request {rid} is still in flight")
        elif len(conn.inflight) >= self.config.max_inflight_per_conn:
            self._busy(conn, rid, self.service.retry_after_ms(msg["session"]))
        else:
            task = asyncio.get_running_loop().create_task(self._line(conn, msg))
            conn.inflight[rid] = task
            task.add_done_callback(lambda t, r=rid: _forget(conn.inflight, r, t))

    def _cancel(self, conn: _Conn, rid: int) -> None:
        """Answer the request_line ``rid`` with ``error cancelled`` now and drop its line; a
        rid not in flight (already answered, or never asked) is ignored."""
        task = conn.inflight.pop(rid, None)
        if task is None:
            return
        task.cancel()
        self._request_error(conn, rid, "cancelled", f"request_line {rid} cancelled by the client")

    async def _line(self, conn: _Conn, msg: dict[str, Any]) -> None:
        rid, sid = msg["rid"], msg["session"]

        def piece(text: str) -> None:
            if conn.inflight.get(rid) is task:  # not after a cancel
                self._send(conn, {"t": "piece", "rid": rid, "text": text})

        task = asyncio.current_task()
        # the service's request runs on even if this task is cancelled (a cancel message, or
        # the connection closing): its own deadline ends it and it is answered to nobody
        request = asyncio.ensure_future(self.service.request_line(
            sid, msg["intent"], context=msg.get("context"), seed=msg.get("seed"),
            deadline_ms=msg.get("deadline_ms"), max_tokens=msg.get("max_tokens"),
            critical=msg.get("critical", False), batch=msg.get("batch", True),
            on_piece=piece if msg.get("stream", False) else None))
        request.add_done_callback(_retrieve)
        try:
            line: DialogueLine = await asyncio.shield(request)
        except Busy as exc:
            self._busy(conn, rid, exc.retry_after_ms)
            return
        except SessionNotFound:
            self._request_error(conn, rid, "unknown_session", f"request_line: session {sid!r} closed")
            return
        except ValueError as exc:
            self._request_error(conn, rid, "invalid_request", f"request_line: {exc}")
            return
        self.lines_total += 1
        self.fallbacks_total += line.fallback
        out: dict[str, Any] = {"t": "line", "rid": rid, "session": sid, "text": line.text,
                               "fallback": line.fallback, "tokens": len(line.tokens),
                               "latency_ms": line.latency_ms, "ttft_ms": line.ttft_ms,
                               "cached_tokens": line.cached_tokens, "served_by": line.served_by}
        if line.fallback_reason is not None:
            out["fallback_reason"] = line.fallback_reason
        self._send(conn, out)


def _forget(inflight: dict[int, asyncio.Task[None]], rid: int, task: asyncio.Task[None]) -> None:
    """Drop ``rid`` from ``inflight`` if it still names ``task`` (a cancelled rid may be
    reused by a newer request)."""
    if inflight.get(rid) is task:
        del inflight[rid]


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a finished service request's outcome as seen (nobody may await it any more)."""
    if not future.cancelled():
        future.exception()


async def _start_http(server: DialogueServer, host: str, port: int) -> tuple[Any, int]:
    """/health and /metrics for a dialogue server (aiohttp, the pattern of server_sync.sync.http_port)."""
    from aiohttp import web
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    from ..transport.http import serve_app

    class Collector:
        def collect(self) -> Any:
            c = CounterMetricFamily
            yield GaugeMetricFamily("flashnpc_dialogue_clients", "connected dialogue WebSocket clients",
                                    value=len(server.conns))
            for name, doc, value in (("connections", "connections accepted", server.connections_total),
                                     ("lines", "lines answered", server.lines_total),
                                     ("fallback_lines", "lines answered with a fallback",
                                      server.fallbacks_total),
                                     ("busy_replies", "requests answered busy", server.busy_total),
                                     ("sent_frames", "frames sent", server.frames_out),
                                     ("sent_bytes", "payload bytes sent", server.bytes_out)):
                yield c(f"flashnpc_dialogue_{name}", doc, value=value)
            errors = c("flashnpc_dialogue_errors", "errors sent, by code", labels=["code"])
            for code, n in sorted(server.errors.items()):
                errors.add_metric([code], n)
            yield errors
            msgs = c("flashnpc_dialogue_messages", "messages received, by type", labels=["type"])
            for t, n in sorted(server.messages.items()):
                msgs.add_metric([t], n)
            yield msgs

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())  # type: ignore[arg-type]

    async def health(_: web.Request) -> web.Response:
        h = server.health()
        return web.json_response(h, status=200 if h["status"] == "ready" else 503)

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry) + server.service.exposition()
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return await serve_app(app, host, port)
