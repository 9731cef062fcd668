"""A world's line requests: queued, in flight at the engine, delivered, and the stale-line policy.

:class:`Speech` is the part of a :class:`plugin.World` that talks to the line engine. The world
asks it for a line (:meth:`Speech.request`: a player walked up, or :meth:`plugin.World.talk`);
each frame it sends queued requests (:meth:`Speech.send`, up to ``max_in_flight`` active, each
once its NPC's tree has ticked since), collects finished lines as :class:`~plugin.events.Line`
events (:meth:`Speech.collect`) and, when an NPC's state changes under a line in flight, applies
the stale-line policy (:meth:`Speech.state_changed`; docs/plugin.md, "Lines in flight and stale
lines"). The prompt of a request is the world's (:meth:`plugin.World._prompt`: blackboard ->
prompt), and so are the events and counters it reports into.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .events import Line, LineDropped, LinePiece

if TYPE_CHECKING:
    from .world import NPC, Player, World

__all__ = ["Speech"]

log = logging.getLogger("flashnpc.plugin")


@dataclass(eq=False)
class _Request:
    id: int
    npc: NPC
    player: Player | None
    intent: str
    kind: str  # "approach" or "talk"
    regenerated: int = 0
    tick0: int = -1  # the NPC tree's tick count when queued: wait for one more tick
    queued_at: float = 0.0


@dataclass(eq=False)
class _Flight:
    request: _Request
    state: str
    version: int
    future: Future[Any]
    pieces: deque[str] = field(default_factory=deque)
    shown: str = ""
    stale: bool = False


def _pid(req: _Request) -> Any:
    return None if req.player is None else req.player.id


class Speech:
    """The line requests of ``world``: a queue, the flights at the engine, and what was delivered
    (latencies and prefix-cache hits, for :meth:`plugin.World.stats`)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.queue: deque[_Request] = deque()
        self.flights: list[_Flight] = []
        self.latencies: deque[float] = deque(maxlen=4096)
        self.cache_hits = 0
        self._next_request = 0
        self._executor: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ asking

    def request(self, npc: NPC, player: Player | None, intent: str, kind: str) -> int:
        """Queue a line of ``npc`` for ``player`` (``kind``: ``approach`` or ``talk``); returns
        its request id."""
        req = self._new_request(npc, player, intent, kind)
        self.queue.append(req)
        return req.id

    def _new_request(self, npc: NPC, player: Player | None, intent: str, kind: str,
                     regenerated: int = 0, request_id: int | None = None) -> _Request:
        if request_id is None:
            self._next_request += 1
            request_id = self._next_request
        tick0 = -1 if regenerated else self.world._progress(npc)
        return _Request(request_id, npc, player, intent, kind, regenerated, tick0, self.world.time)

    def speaking(self, npc: NPC) -> bool:
        """A line of ``npc`` is queued, or in flight and not stale."""
        return (any(f.request.npc is npc and not f.stale for f in self.flights)
                or any(r.npc is npc for r in self.queue))

    def pending(self) -> bool:
        """Anything queued or in flight."""
        return bool(self.queue or self.flights)

    def active(self) -> int:
        """Requests in flight that are not stale."""
        return sum(1 for f in self.flights if not f.stale)

    # ------------------------------------------------------------------ sending

    def send(self, force: bool = False) -> None:
        """Send queued requests, oldest first, while fewer than ``max_in_flight`` are active.

        A request waits until the NPC's tree has ticked once since it was queued (so the line
        reflects how the tree reacted to the player arriving or to the intent), unless the tree
        sleeps on (it did not read what changed) or two tick periods have passed.
        """
        if not self.queue:
            return
        w = self.world
        waiting: deque[_Request] = deque()
        queue = self.queue
        while queue:
            req = queue.popleft()
            npc = req.npc
            if npc.id not in w.npcs or (req.player is not None and req.player.id not in w.players):
                continue
            if req.kind == "approach" and req.player is not None and req.player.id not in npc.near:
                w.counters["dropped_out_of_range"] += 1
                self.drop(req, "out_of_range")
                continue
            if (self.active() >= w.max_in_flight or (
                    not force and w._progress(npc) == req.tick0
                    and (npc.remote or not npc.tree.asleep)
                    and w.time - req.queued_at < 2.0 / npc.rate_hz - 1e-9)):
                waiting.append(req)
                continue
            self._start(req)
        self.queue = waiting

    def _start(self, req: _Request) -> None:
        w = self.world
        npc = req.npc
        state = w._state_of(npc)
        kwargs = w._prompt(req)
        w.counters["requests"] += 1
        gen = w.generator
        flight = _Flight(req, state, npc.state_version, Future())
        if w.deterministic:
            try:
                if w.stream:
                    stream = gen.generate_stream(npc.archetype, state, **kwargs)
                    for piece in stream:
                        flight.shown += piece
                        w._events.append(LinePiece(npc.id, kwargs["player_id"], req.id, piece,
                                                   flight.shown, w.time))
                    flight.future.set_result(stream.line)
                else:
                    flight.future.set_result(gen.generate(npc.archetype, state, **kwargs))
            except Exception as exc:
                flight.future.set_exception(exc)
        elif w.stream:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="flashnpc-world-stream")
            flight.future = self._executor.submit(self._stream_job, flight, npc.archetype, state, kwargs)
        else:
            try:
                flight.future = gen.submit(npc.archetype, state, **kwargs)
            except Exception as exc:  # e.g. a slot value the engine refuses: an error line, not a crash
                flight.future.set_exception(exc)
        self.flights.append(flight)

    def _stream_job(self, flight: _Flight, archetype: str, state: str, kwargs: dict[str, Any]) -> Any:
        stream = self.world.generator.generate_stream(archetype, state, **kwargs)
        for piece in stream:
            if flight.stale:
                break  # nobody will see the rest; free the worker for the regenerated line
            flight.pieces.append(piece)
        return stream.line

    # ------------------------------------------------------------------ collecting

    def collect(self) -> None:
        """Turn finished lines (and streamed pieces) into events; stale flights end silently."""
        w = self.world
        if not w.deterministic and not w.stream and self.flights:
            w.generator.poll()  # answers requests past their deadline with a fallback line
        keep: list[_Flight] = []
        for f in self.flights:
            req = f.request
            if not f.stale:
                while f.pieces:
                    piece = f.pieces.popleft()
                    f.shown += piece
                    w._events.append(LinePiece(req.npc.id, _pid(req), req.id, piece, f.shown, w.time))
            if not f.future.done():
                keep.append(f)
                continue
            if f.stale:
                continue
            try:
                line = f.future.result()
            except Exception:
                log.exception("line request %d for NPC %r failed", req.id, req.npc.id)
                w.counters["dropped_error"] += 1
                self.drop(req, "error")
                continue
            if line is None:  # a stream abandoned by the engine
                w.counters["dropped_error"] += 1
                self.drop(req, "error")
                continue
            self._deliver(f, line)
        self.flights = keep

    def _deliver(self, f: _Flight, line: Any) -> None:
        w = self.world
        req = f.request
        event = Line(
            npc_id=req.npc.id, player_id=_pid(req), text=line.text, state=f.state,
            latency_ms=line.latency_ms, fallback=line.fallback, intent=req.intent,
            archetype=req.npc.archetype, request_id=req.id, ttft_ms=line.ttft_ms,
            prefix_cache_hit=line.prefix_cache_hit, fallback_reason=line.fallback_reason,
            regenerated=req.regenerated, time=w.time,
        )
        w.counters["lines"] += 1
        w.counters["fallbacks"] += int(line.fallback)
        self.cache_hits += int(line.prefix_cache_hit)
        self.latencies.append(line.latency_ms)
        w.recent_lines.append(event)
        w._events.append(event)

    def drop(self, req: _Request, reason: str, regenerating: bool = False) -> None:
        self.world._events.append(LineDropped(req.npc.id, _pid(req), req.id, reason, regenerating,
                                              self.world.time))

    def latency_ms(self, q: float) -> float | None:
        """The ``q``-th percentile of the delivered lines' latencies (the last 4096), or None."""
        lat = sorted(self.latencies)
        if not lat:
            return None
        return lat[min(len(lat) - 1, max(0, math.ceil(q / 100 * len(lat)) - 1))]

    # ------------------------------------------------------------------ the stale-line policy

    def state_changed(self, npc: NPC) -> None:
        """``npc``'s state changed: its lines in flight are stale (regenerated or dropped)."""
        for f in self.flights:
            if f.request.npc is npc and not f.stale:
                f.stale = True
                self._regenerate_or_drop(f.request)

    def _regenerate_or_drop(self, req: _Request) -> None:
        """The stale-line policy: a dialogue turn (talk) is asked again in the new state, up to
        ``max_regenerations`` times; an approach bark is asked again only while its player is
        still within the NPC's radius; anything else is dropped."""
        w = self.world
        w.counters["dropped_stale"] += 1
        again = req.regenerated < w.max_regenerations and (
            req.kind == "talk" or (req.player is not None and req.player.id in req.npc.near))
        self.drop(req, "stale", regenerating=again)
        if again:
            w.counters["regenerated"] += 1
            self.queue.appendleft(self._new_request(req.npc, req.player, req.intent, req.kind,
                                                    req.regenerated + 1, request_id=req.id))

    def supersede(self, npc: NPC) -> None:
        """A dialogue turn with ``npc`` replaces its ambient lines: those in flight are dropped
        (``superseded``), queued ones forgotten."""
        for f in self.flights:
            if f.request.npc is npc and not f.stale and f.request.kind == "approach":
                f.stale = True
                self.world.counters["dropped_superseded"] += 1
                self.drop(f.request, "superseded")
        self.queue = deque(r for r in self.queue if not (r.npc is npc and r.kind == "approach"))

    def forget_npc(self, npc: NPC) -> None:
        """``npc`` left the world: its queued and in-flight lines end silently."""
        self.queue = deque(r for r in self.queue if r.npc is not npc)
        for f in self.flights:
            if f.request.npc is npc:
                f.stale = True

    def forget_player(self, player: Player) -> None:
        """``player`` left the world: the lines for it end silently."""
        self.queue = deque(r for r in self.queue if r.player is not player)
        for f in self.flights:
            if f.request.player is player:
                f.stale = True

    def restart_waits(self, npc: NPC) -> None:
        """``npc`` became remote or local: its queued requests wait on the other kind of progress."""
        progress = self.world._progress(npc)
        for req in self.queue:
            if req.npc is npc and req.tick0 != -1:
                req.tick0 = progress

    def close(self) -> None:
        """Stop the streaming worker (if any)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
