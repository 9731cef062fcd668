"""``DialogueClient``: the asyncio client of the dialogue protocol (docs/protocol.md), for a thin
game client or the plugin, against one dialogue server or a front of several
(docs/dialogue_front.md)::

    client = DialogueClient("ws://front:8080", token, key="player-17")
    await client.connect()                             # hello; raises if refused
    guard = await client.open_session("guard", "patrol", persona=["gruff"])
    line = await guard.request_line("greet", on_piece=show)   # a Line, never silence
    await guard.update_state(state="alert")            # kept: re-sent after a re-open
    await client.close()

One client is one WebSocket connection, made to ``url`` with ``?session=KEY`` added (the front
hashes that key to pick the worker: every session of this client lives on one worker, the one
that holds their prefix cache). A client holds up to the server's 64 sessions; use a client per
key for sessions that should spread over workers. ``open_session`` messages (first opens and
re-opens alike) are paced at ``open_rate`` (15) per second in bursts of ``open_burst`` (30),
under the server's per-connection rate limit (20 messages/s, bursts of 40, by default): a
client that opens or re-opens many sessions at once is not cut as ``rate_limited``.

**When the worker is lost** - the connection drops (the worker died, or the front did), or a
request has no answer ``answer_grace_s`` after its deadline (the worker hangs: the client then
drops the connection itself) - every request in flight on it is answered at once with an
authored fallback line for its NPC's archetype and state (:class:`runtime.client.fallback.
FallbackBook`; ``fallback=True``, ``fallback_reason`` ``"worker_lost"`` or ``"no_answer"``). The
client reconnects through the same URL (the front sends it to a live worker), says hello, and
re-opens every session with its last archetype, state, persona and context; the
:class:`DialogueSession` objects stay valid, only their server ids change. A request made
while no worker is reachable waits for the re-open until its deadline, then is answered with a
fallback line (``"no_worker"``). So every ``request_line`` ends in a
:class:`Line`, :class:`Busy` (the server's ``busy``, passed through unchanged with its
``retry_after_ms``) or :class:`RequestError` (an ``error`` with this request's rid, e.g.
``invalid_request``). The server's own fallbacks (``breaker_open``, ``deadline``, ...) arrive as
lines with ``fallback=True`` and its reason, unchanged.

A refusal reconnecting cannot cure (``auth_failed``, ``unsupported_version``) stops the client:
:meth:`connect` raises :class:`DialogueRefused`; later requests get fallback lines
(``"refused"``) and :attr:`DialogueClient.refused` says why. Messages are handled synchronously
as they arrive (:mod:`server_sync.transport.ws_io`): ``on_piece`` must not block.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from websockets.exceptions import ConnectionClosed, InvalidHandshake

from runtime.client.fallback import FallbackBook

from ..transport.wire import PROTOCOL_VERSION, Codec, ProtocolError, encode
from ..transport.ws_io import WsClientConnection, ws_connect
from .dialogue_protocol import MAX_DEADLINE_MS, decode_dialogue_server

__all__ = ["Busy", "DialogueClient", "DialogueRefused", "DialogueSession", "Line", "RequestError",
           "affinity_url"]

#: error codes (without a rid) after which reconnecting cannot help
FATAL_CODES = frozenset({"auth_failed", "unsupported_version"})


class Busy(Exception):
    """The server answered ``busy``: ask again after ``retry_after_ms``."""

    def __init__(self, retry_after_ms: int) -> None:
        super().__init__(f"busy, retry after {retry_after_ms} ms")
        self.retry_after_ms = retry_after_ms


class RequestError(Exception):
    """The server answered this request with ``error`` (``code``, ``reason``)."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason


class DialogueRefused(RequestError):
    """The server refused the connection for good (bad token, wrong protocol version)."""


@dataclass(frozen=True)
class Line:
    """One answered ``request_line``. ``fallback``: an authored line, from the server (its
    ``fallback_reason``) or from this client when the worker was lost (``worker_lost``,
    ``no_answer``, ``no_worker``, ``refused``, ``closed``). ``latency_ms`` and ``ttft_ms`` are
    measured here (send to final line / first piece; ttft None without pieces);
    ``server_latency_ms`` is the server's own figure (None for a client fallback). ``worker`` is
    the worker the request went to (its welcome's ``worker``; None if it never left).
    ``served_by``: the server's ``served_by`` (the model that wrote it, or ``authored``; None
    for a client fallback)."""

    text: str
    fallback: bool
    fallback_reason: str | None
    tokens: int
    latency_ms: float
    ttft_ms: float | None
    worker: str | None
    server_latency_ms: float | None = None
    cached_tokens: int = 0
    served_by: str | None = None


def affinity_url(url: str, key: str | None) -> str:
    """``url`` with the affinity query argument ``session=key`` set (replacing one there)."""
    if key is None:
        return url
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "session"]
    query.append(("session", key))
    return urlunsplit(parts._replace(path=parts.path or "/", query=urlencode(query)))


@dataclass(eq=False)
class DialogueSession:
    """A dialogue session with one NPC. Its state (archetype, persona, state, context) is kept
    here and re-sent when the session is re-opened on another worker; ``sid`` is its id on the
    current worker (None while it is being re-opened); ``opens`` counts the workers that
    opened it (more than one: it was re-opened)."""

    client: DialogueClient
    archetype: str
    state: str
    persona: tuple[str, ...] = ()
    context: dict[str, str] = field(default_factory=dict)
    sid: str | None = None
    model: str | None = None           # the served model it asks for (None: the server's base)
    essential: bool = True             # False: the capacity rule may serve it more cheaply
    opens: int = 0
    error: RequestError | None = None  # a re-open was refused: its requests raise it
    closed: bool = False
    version: int = 0                   # bumped by every local change of the state above
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    opening: _Link | None = None       # the link an open_session is out on

    async def request_line(self, intent: str, **kw: Any) -> Line:
        """See :meth:`DialogueClient.request_line`."""
        return await self.client.request_line(self, intent, **kw)

    async def update_state(self, **kw: Any) -> None:
        """See :meth:`DialogueClient.update_state`."""
        await self.client.update_state(self, **kw)

    async def close(self) -> None:
        """See :meth:`DialogueClient.close_session`."""
        await self.client.close_session(self)


class _Lost(Exception):
    """The request's worker was lost (``reason``: worker_lost or no_answer)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(eq=False)
class _Pending:
    kind: str  # "line" | "open" | "ok": the answer expected
    future: asyncio.Future[Any]
    sent_at: float = 0.0
    first_piece_at: float | None = None
    on_piece: Callable[[str], None] | None = None


@dataclass(eq=False)
class _Link:
    """One connection to one worker, welcomed."""

    ws: WsClientConnection
    worker: str | None = None
    welcomed: asyncio.Future[dict[str, Any]] | None = None
    pending: dict[int, _Pending] = field(default_factory=dict)


class DialogueClient:
    """A dialogue connection that survives its worker (see the module docstring).

    ``token``: a token string or a callable returning a fresh one (called per connect).
    ``key``: the affinity key put into the URL (None: none, e.g. straight to one server).
    ``fallbacks``: the authored lines (default the shipped model's). ``deadline_ms``: the
    deadline sent with every request (default 1000; the server answers by it, with a fallback
    line if need be). ``answer_grace_s``: how long after a deadline a missing answer means the
    worker is lost. ``open_timeout_s``: the handshake, the hello and each (re-)open must succeed
    within it. Reconnects back off exponentially with full jitter from ``backoff_initial_s``
    to ``backoff_max_s`` (``seed`` makes the jitter and the fallback picks reproducible)."""

    def __init__(self, url: str, token: str | Callable[[], str], *, key: str | None = None,
                 fallbacks: FallbackBook | None = None, codec: Codec = "msgpack",
                 deadline_ms: int = 1000, answer_grace_s: float = 2.0, open_timeout_s: float = 5.0,
                 backoff_initial_s: float = 0.05, backoff_max_s: float = 2.0,
                 seed: int | None = None, max_size: int = 2**20, open_rate: float = 15.0,
                 open_burst: int = 30) -> None:
        import numpy as np

        if not 1 <= deadline_ms <= MAX_DEADLINE_MS:
            raise ValueError(f"DialogueClient: deadline_ms must be 1..{MAX_DEADLINE_MS}, got {deadline_ms}")
        if min(answer_grace_s, open_timeout_s, backoff_initial_s, backoff_max_s) <= 0:
            raise ValueError("DialogueClient: answer_grace_s, open_timeout_s and the backoffs must be > 0")
        if open_rate <= 0 or open_burst < 1:
            raise ValueError(f"DialogueClient: open_rate must be > 0 and open_burst >= 1, "
                             f"got {open_rate} and {open_burst}")
        self.open_rate = open_rate
        self.open_burst = open_burst
        self._open_tokens = float(open_burst)
        self._open_at: float | None = None
        self.url = affinity_url(url, key)
        self.key = key
        self._token = token
        self.fallbacks = fallbacks if fallbacks is not None else FallbackBook.shipped()
        self.codec: Codec = codec
        self.deadline_ms = deadline_ms
        self.answer_grace_s = answer_grace_s
        self.open_timeout_s = open_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.max_size = max_size
        self._rng = random.Random(seed)
        self._np_rng = np.random.default_rng(seed)
        self._rids = itertools.count(1)
        self.sessions: list[DialogueSession] = []
        self._link: _Link | None = None
        self._runner: asyncio.Task[None] | None = None
        self._first: asyncio.Future[None] | None = None
        self._closing = False
        self.refused: DialogueRefused | None = None
        # counters
        self.connects = 0           # connections welcomed
        self.reopens = 0            # sessions re-opened on another connection
        self.worker_losses = 0      # welcomed connections lost (or dropped: no answer)
        self.client_fallbacks = 0   # lines answered here with an authored line

    # ---- public API ------------------------------------------------------------------------
    @property
    def worker(self) -> str | None:
        """The worker the client is connected to now (its welcome's ``worker``), or None."""
        return self._link.worker if self._link is not None else None

    @property
    def connected(self) -> bool:
        """Welcomed by a worker now (False while reconnecting)."""
        return self._link is not None

    async def connect(self) -> None:
        """Connect and say hello; from then on the client reconnects by itself. Raises what
        the attempt met: OSError, InvalidHandshake or TimeoutError (cannot reach the server),
        :class:`DialogueRefused` (the hello was refused); connect may then be called again."""
        if self._runner is not None and not self._runner.done():
            raise RuntimeError("DialogueClient.connect: already connected")
        loop = asyncio.get_running_loop()
        self._first = loop.create_future()
        self._runner = loop.create_task(self._run(self._first))
        await asyncio.shield(self._first)

    async def open_session(self, archetype: str, state: str, *, persona: Sequence[str] = (),
                           context: Mapping[str, str] | None = None, model: str | None = None,
                           essential: bool = True) -> DialogueSession:
        """Open a session with an NPC of ``archetype`` in ``state``; returns once a worker has
        opened it. ``model``: the served model to use (a fine-tune's name; None: the base);
        ``essential=False`` lets the server's capacity rule serve it by a lighter model or
        authored lines (docs/finetune.md); both are re-sent on a re-open. Raises :class:`Busy`, :class:`RequestError` (``invalid_request``: a value
        the model does not know) or TimeoutError (no worker within ``open_timeout_s``)."""
        self._check_running()
        s = DialogueSession(self, archetype, state, tuple(persona), dict(context or {}),
                            model=model, essential=essential)
        self.sessions.append(s)
        try:
            link = self._link
            if link is not None:
                with contextlib.suppress(_Lost):  # lost: the connection loop re-opens it
                    await self._open_one(link, s)
            await asyncio.wait_for(s.opened.wait(), self.open_timeout_s)
            if s.error is not None:
                raise s.error
            if self.refused is not None:
                raise self.refused
        except BaseException:
            s.closed = True
            self.sessions.remove(s)
            raise
        return s

    async def request_line(self, session: DialogueSession, intent: str, *,
                           context: Mapping[str, str] | None = None,
                           on_piece: Callable[[str], None] | None = None,
                           deadline_ms: int | None = None, critical: bool = False,
                           batch: bool = True, seed: int | None = None,
                           max_tokens: int | None = None) -> Line:
        """Ask ``session``'s NPC for a line for ``intent`` (``context`` merged over the
        session's for this line); ``on_piece(text)``: stream, called with each decoded piece.
        Always answered within ``deadline_ms`` plus ``answer_grace_s`` (see the module
        docstring): a :class:`Line`, or :class:`Busy`, or :class:`RequestError`. Cancelling the
        awaiting task sends ``cancel``."""
        self._check_session(session)
        deadline_ms = self.deadline_ms if deadline_ms is None else deadline_ms
        t0 = time.perf_counter()
        give_up = t0 + deadline_ms / 1000.0 + self.answer_grace_s
        if self.refused is None and (session.sid is None or self._link is None):
            with contextlib.suppress(TimeoutError):  # re-opening: wait for it, up to the deadline
                await asyncio.wait_for(session.opened.wait(),
                                       max(0.0, t0 + deadline_ms / 1000.0 - time.perf_counter()))
        if session.error is not None:
            raise session.error
        link = self._link
        left_ms = int(deadline_ms - 1000.0 * (time.perf_counter() - t0))
        if self.refused is not None or session.sid is None or link is None or left_ms < 1:
            return self._fallback(session, "refused" if self.refused else "no_worker", t0, None, intent)
        msg: dict[str, Any] = {"t": "request_line", "rid": 0, "session": session.sid,
                               "intent": intent, "deadline_ms": left_ms}
        for k, v in (("context", dict(context) if context else None), ("seed", seed),
                     ("max_tokens", max_tokens), ("stream", on_piece is not None or None),
                     ("critical", critical or None), ("batch", None if batch else False)):
            if v is not None:
                msg[k] = v
        try:
            line = await self._request(link, msg, _Pending("line", self._future(), on_piece=on_piece),
                                       give_up - time.perf_counter())
        except _Lost as lost:
            return self._fallback(session, "closed" if self._closing else lost.reason, t0, link.worker,
                                  intent)
        assert isinstance(line, Line)
        return line

    async def update_state(self, session: DialogueSession, *, state: str | None = None,
                           persona: Sequence[str] | None = None,
                           context: Mapping[str, str] | None = None) -> None:
        """Change the session's state, persona or context (merged): sent to the worker
        (:class:`RequestError` if it refuses a value; the local copy then stays as it was) and
        kept here, to be re-sent whole if the session is re-opened."""
        self._check_session(session)
        if state is None and persona is None and context is None:
            raise ValueError("update_state needs state, persona or context")
        link = self._link
        if session.sid is not None and link is not None:
            msg: dict[str, Any] = {"t": "update_state", "rid": 0, "session": session.sid}
            for k, v in (("state", state), ("persona", None if persona is None else list(persona)),
                         ("context", None if context is None else dict(context))):
                if v is not None:
                    msg[k] = v
            with contextlib.suppress(_Lost):  # lost: the re-open carries the new state
                await self._request(link, msg, _Pending("ok", self._future()), self.open_timeout_s)
        session.state = state if state is not None else session.state
        session.persona = tuple(persona) if persona is not None else session.persona
        session.context = {**session.context, **(context or {})}
        session.version += 1

    async def close_session(self, session: DialogueSession) -> None:
        """Close ``session`` here and on its worker (a lost worker closed it already)."""
        if session.closed:
            return
        session.closed = True
        if session in self.sessions:
            self.sessions.remove(session)
        link = self._link
        if session.sid is not None and link is not None:
            with contextlib.suppress(_Lost, RequestError):
                await self._request(link, {"t": "close_session", "rid": 0, "session": session.sid},
                                    _Pending("ok", self._future()), self.open_timeout_s)

    async def close(self) -> None:
        """Say bye, close the connection and stop reconnecting; requests still in flight are
        answered with fallback lines (``closed``)."""
        self._closing = True
        link = self._link
        if link is not None:
            with contextlib.suppress(ConnectionClosed):
                link.ws.send(encode({"t": "bye"}, self.codec))
                link.ws.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(link.ws.wait_closed(), 2.0)
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._runner

    async def drop_connection(self) -> None:
        """Abort the socket without a bye (a network drop, for tests and load tests): what was
        in flight is answered with fallbacks and the client reconnects."""
        if self._link is not None:
            self._link.ws.abort()

    # ---- internals -------------------------------------------------------------------------
    def _check_running(self) -> None:
        if self._runner is None:
            raise RuntimeError("DialogueClient: call connect() first")
        if self._closing:
            raise RuntimeError("DialogueClient: closed")

    def _check_session(self, session: DialogueSession) -> None:
        self._check_running()
        if session.client is not self or session.closed:
            raise ValueError("DialogueClient: the session is closed or not this client's")

    def _future(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    def _fallback(self, session: DialogueSession, reason: str, t0: float,
                  worker: str | None, intent: str | None) -> Line:
        """An authored line that answers ``intent`` in the session's state (FallbackBook's order)."""
        self.client_fallbacks += 1
        text = self.fallbacks.pick(session.archetype, session.state, session, self._np_rng, intent)
        return Line(text, True, reason, 0, 1000.0 * (time.perf_counter() - t0), None, worker)

    async def _request(self, link: _Link, msg: dict[str, Any], pending: _Pending,
                       timeout_s: float) -> Any:
        """Send ``msg`` with a fresh rid on ``link`` and return its answer's value; raise Busy
        or RequestError as answered, or _Lost when the link went first. No answer within
        ``timeout_s`` means the worker hangs: the link is dropped (the others on it lost) and
        this one raises _Lost("no_answer"). Cancelling a line sends ``cancel``."""
        rid = next(self._rids)
        msg["rid"] = rid
        pending.sent_at = time.perf_counter()
        link.pending[rid] = pending
        try:
            link.ws.send(encode(msg, self.codec))
        except ConnectionClosed:
            link.pending.pop(rid, None)
            raise _Lost("worker_lost") from None
        try:
            value = await asyncio.wait_for(asyncio.shield(pending.future), max(0.0, timeout_s))
        except TimeoutError:
            link.pending.pop(rid, None)
            link.ws.abort()  # connection_lost follows: the run loop answers the others
            self._lost(link)
            raise _Lost("no_answer") from None
        except asyncio.CancelledError:
            if link.pending.pop(rid, None) is pending and pending.kind == "line":
                with contextlib.suppress(ConnectionClosed):
                    link.ws.send(encode({"t": "cancel", "rid": rid}, self.codec))
            raise
        if value is None:
            raise _Lost("worker_lost")
        return value

    def _on_frame(self, link: _Link, frame: bytes | str) -> None:
        msg, _ = decode_dialogue_server(frame)
        t = msg["t"]
        if t == "welcome":
            link.worker = msg.get("worker")
            if link.welcomed is not None and not link.welcomed.done():
                link.welcomed.set_result(msg)
            return
        rid = msg.get("rid")
        if t == "bye" or rid is None:
            if t == "error" and msg["code"] in FATAL_CODES:
                self.refused = DialogueRefused(msg["code"], msg["reason"])
            return  # the server closes the connection next
        p = link.pending.get(rid)
        if p is None:
            return  # the answer to a request given up on (cancelled, timed out)
        now = time.perf_counter()
        if t == "piece":
            if p.first_piece_at is None:
                p.first_piece_at = now
            if p.on_piece is not None:
                p.on_piece(msg["text"])
            return
        del link.pending[rid]
        if t == "busy":
            p.future.set_exception(Busy(msg["retry_after_ms"]))
        elif t == "error":
            p.future.set_exception(RequestError(msg["code"], msg["reason"]))
        elif t == "session" and p.kind == "open":
            p.future.set_result(msg["session"])
        elif t == "line" and p.kind == "line":
            ttft = None if p.first_piece_at is None else 1000.0 * (p.first_piece_at - p.sent_at)
            p.future.set_result(Line(msg["text"], msg["fallback"], msg.get("fallback_reason"),
                                     msg["tokens"], 1000.0 * (now - p.sent_at), ttft, link.worker,
                                     msg["latency_ms"], msg.get("cached_tokens", 0),
                                     msg.get("served_by")))
        elif t == "ok" and p.kind == "ok":
            p.future.set_result(True)
        else:
            raise ProtocolError(f"{t} answers request {rid}, which expects {p.kind}")

    def _lost(self, link: _Link) -> None:
        """``link`` is gone: its sessions need a re-open, and every request on it is answered
        (its awaiting call sees None: lost)."""
        if self._link is link:
            self._link = None
            self.worker_losses += 1
            for s in self.sessions:
                s.sid = None
                s.opened.clear()
        pending, link.pending = list(link.pending.values()), {}
        for p in pending:
            if not p.future.done():
                p.future.set_result(None)

    async def _open_slot(self) -> None:
        """Wait for this open's turn: a token bucket of ``open_burst`` refilled at
        ``open_rate`` per second; each caller reserves a token (the count may go negative)
        and sleeps until its reservation is covered, so concurrent opens queue in order."""
        now = asyncio.get_running_loop().time()
        if self._open_at is not None:
            self._open_tokens = min(float(self.open_burst),
                                    self._open_tokens + (now - self._open_at) * self.open_rate)
        self._open_at = now
        self._open_tokens -= 1.0
        if self._open_tokens < 0:
            await asyncio.sleep(-self._open_tokens / self.open_rate)

    async def _open_one(self, link: _Link, s: DialogueSession) -> None:
        """Open ``s`` on ``link`` (with its state as it is now; a change made meanwhile follows
        as an update_state). Raises Busy, RequestError or _Lost."""
        s.opening = link
        try:
            await self._open_slot()
            version = s.version
            sid = await self._request(link, {"t": "open_session", "rid": 0, **_open_fields(s),
                                             **_routing_fields(s)},
                                      _Pending("open", self._future()), self.open_timeout_s)
        finally:
            s.opening = None
        if s.closed:  # closed while opening: close it on the worker too
            with contextlib.suppress(ConnectionClosed):
                link.ws.send(encode({"t": "close_session", "rid": next(self._rids), "session": sid},
                                    self.codec))
            return
        s.sid = sid
        s.opens += 1
        self.reopens += s.opens > 1
        if s.version != version:
            update = {"t": "update_state", "rid": next(self._rids), "session": sid,
                      **_open_fields(s)}
            del update["archetype"]
            with contextlib.suppress(ConnectionClosed):  # its ok is not awaited
                link.ws.send(encode(update, self.codec))
        s.opened.set()

    async def _reopen_all(self, link: _Link) -> None:
        """Open every session that has no server id on ``link`` (a re-open after a lost
        worker, or a first open that was cut off); ``busy`` is retried after its
        ``retry_after_ms``, a refusal is kept in the session's ``error``."""
        todo = [s for s in self.sessions if s.sid is None and s.opening is not link]
        while todo and self._link is link:
            results = await asyncio.gather(*[self._open_one(link, s) for s in todo],
                                           return_exceptions=True)
            busy_ms, retry = 0, []
            for s, r in zip(todo, results, strict=True):
                if isinstance(r, _Lost):
                    return  # lost again: the connection loop starts over
                if isinstance(r, Busy):
                    busy_ms = max(busy_ms, r.retry_after_ms)
                    retry.append(s)
                elif isinstance(r, RequestError):
                    s.error = r
                    s.opened.set()
                elif isinstance(r, BaseException):
                    raise r
            todo = retry
            if todo:
                await asyncio.sleep(busy_ms / 1000.0)

    async def _run(self, first: asyncio.Future[None]) -> None:
        """Connect, hello, (re)open every session, wait for the end of the link; repeat with
        backoff until closed or refused. ``first`` hears the first attempt's outcome."""
        attempt = 0
        while not self._closing:
            link: _Link | None = None
            try:
                link = await self._connect_once()
                attempt = 0
                if not first.done():
                    first.set_result(None)
                await self._reopen_all(link)
                await link.ws.wait_closed()
            except (OSError, ConnectionClosed, InvalidHandshake, TimeoutError, ProtocolError,
                    DialogueRefused) as exc:
                if not first.done():
                    first.set_exception(self.refused or exc)
                    return
            finally:
                if link is not None:
                    link.ws.abort()
                    self._lost(link)
            if self.refused is not None:
                for s in self.sessions:
                    s.opened.set()  # waiters see the refusal
                return
            delay = self._rng.uniform(0, min(self.backoff_max_s, self.backoff_initial_s * 2 ** attempt))
            attempt += 1
            await asyncio.sleep(delay)

    async def _connect_once(self) -> _Link:
        holder: list[_Link] = []
        ws = await ws_connect(self.url, lambda frame: self._on_frame(holder[0], frame),
                              open_timeout_s=self.open_timeout_s, max_size=self.max_size)
        link = _Link(ws, welcomed=self._future())
        holder.append(link)
        closed = asyncio.ensure_future(ws.wait_closed())
        try:
            token = self._token() if callable(self._token) else self._token
            ws.send(encode({"t": "hello", "v": PROTOCOL_VERSION, "token": token}, self.codec))
            await asyncio.wait([link.welcomed, closed], timeout=self.open_timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)
            if not link.welcomed.done():
                if self.refused is not None:
                    raise self.refused
                if closed.done():
                    closed.result()  # what the frame handler raised, if anything
                    raise ConnectionError(f"{self.url}: closed before the welcome")
                raise TimeoutError(f"{self.url}: no welcome within {self.open_timeout_s:g} s")
        except BaseException:
            closed.cancel()
            ws.abort()
            raise
        closed.cancel()
        self._link = link
        self.connects += 1
        return link


def _routing_fields(s: DialogueSession) -> dict[str, Any]:
    """What ``open_session`` says of the model (update_state does not carry it)."""
    out: dict[str, Any] = {} if s.model is None else {"model": s.model}
    if not s.essential:
        out["essential"] = False
    return out


def _open_fields(s: DialogueSession) -> dict[str, Any]:
    out: dict[str, Any] = {"archetype": s.archetype, "state": s.state}
    if s.persona:
        out["persona"] = list(s.persona)
    if s.context:
        out["context"] = dict(s.context)
    return out
