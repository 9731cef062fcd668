"""Dialogue sessions served by the batched engine: the runtime side of ``flashnpc serve --dialogue``.

:class:`DialogueService` keeps NPC dialogue sessions (archetype, persona, state, context) and
answers line requests with an asyncio API::

    service = DialogueService.load(device="cuda", max_batch=2048)
    await service.start()
    sid = service.open_session("guard", persona=["gruff"], state="patrol")
    line = await service.request_line(sid, "greet", context={"player": "Aria"})
    async for piece in service.stream_line(sid, "ask_rumors"): ...
    service.update_state(sid, state="alert"); service.close_session(sid)
    await service.close()

What it guarantees:

- **Admission control.** At most ``max_batch + max_queue`` requests are in flight; past that
  :meth:`request_line` raises :class:`Busy` with ``retry_after_ms`` (estimated from the recent
  line rate), so memory never grows without bound.
- **Deadlines.** Every request has one (``deadline_ms``, default ``default_deadline_ms``); when it
  passes the request is cancelled in the engine and answered with an authored fallback line
  (``fallback=True``, ``fallback_reason="deadline"``), or, for a stream that already showed
  text, ended there.
- **Circuit breaker** (:class:`CircuitBreaker`): when over the last ``window_s`` (60 s) the
  error rate passes 5% or the p95 latency passes ``latency_budget_ms``, non-critical requests get
  fallback lines (reason ``breaker_open``) without touching the model, and :meth:`health`
  reports ``degraded``; after a cool-down a few probe requests decide whether it closes again.
- **Engines.** On a CPU :meth:`load` picks :class:`runtime.serving.ort_engine.OrtBatchedEngine` (the
  shipped INT4 graph through onnxruntime: 1.2-2.4x the PyTorch engine's lines per second at the
  same batch size on this project's 2-core machine); on a GPU, :class:`BatchedEngine` (PyTorch).
- **Warm-up.** :meth:`start` first runs a full batch of throwaway requests through every
  engine (``warm_up=False`` skips it): the first steps at a new batch size pay for allocations.
- **CPU threads.** On a CPU :meth:`start` sets torch's intra-op threads to ``cpu_threads``
  (default 1, process-wide; None leaves torch's setting), and the onnxruntime engine's session
  uses as many.
- **Batching opt-out.** ``batch=False`` requests run in a separate lane (their own engine over
  the same weights, one sequence at a time), never sharing a batch with others.
- **Prefix-cache window** (:class:`PrefixHitWindow`): the block cache's hit rate over the
  lookups of the last 30 s, which :mod:`runtime.serving.model_router`'s capacity rule reads;
  ``authored=REASON`` answers a request with an authored line without the model.
- **Lines as the client engine makes them**: the same masks (banned words, slot rules), the same
  checks (no words, a guessing model's low mean log-probability, repeats of the NPC's recent
  lines, resampled with a new seed), free-text slots filled after decoding, authored
  fallbacks from the same :class:`runtime.client.fallback.FallbackBook`, picked for the session's
  archetype and state and the request's intent (a farewell gets a farewell).

Metrics (Prometheus, own :class:`prometheus_client.CollectorRegistry`, ``model_name`` label):
those of :class:`runtime.client.metrics.EngineMetrics` (``flashnpc_line_latency_seconds`` is the
end-to-end latency; ``flashnpc_prefix_cache_hit_tokens_total`` gains a ``tier`` label, l1/l2/l3) plus
``flashnpc_requests_running``, ``flashnpc_requests_waiting``, ``flashnpc_batch_rows``,
``flashnpc_inter_token_latency_seconds``, ``flashnpc_requests_rejected_total``,
``flashnpc_dialogue_sessions`` and ``flashnpc_breaker_state`` (0 closed, 1 half-open, 2 open);
docs/metrics.md lists them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import numpy as np
import torch
from prometheus_client import Counter, Gauge, Histogram

from runtime.client.authored import AuthoredBook
from runtime.client.constraints import (
    RepeatMemory,
    SlotRules,
    fill_slots,
    read_constraints,
    settled_text,
    usable,
    without_broken_bytes,
)
from runtime.client.fallback import FallbackBook
from runtime.client.generator import active_params_percent
from runtime.client.line_fit import FitCache, state_fit
from runtime.client.metrics import EngineMetrics
from runtime.client.onnx_model import FlashOnnx
from runtime.client.repeats import repeated_sentence
from runtime.client.sampling import DEFAULT_TEMPERATURE, DEFAULT_TOP_P
from runtime.client.trigrams import TrigramTable
from runtime.serving.batched_engine import BatchedEngine, GenRequest, GenResult, Handle
from runtime.serving.block_cache import TIERS

log = logging.getLogger("flashnpc.runtime")

BREAKER_STATES = {"closed": 0, "half_open": 1, "open": 2}
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
_ITL_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512)


class Busy(RuntimeError):
    """The request queue is full; retry after ``retry_after_ms`` milliseconds."""

    def __init__(self, retry_after_ms: int) -> None:
        super().__init__(f"busy, retry after {retry_after_ms} ms")
        self.retry_after_ms = retry_after_ms


class SessionNotFound(KeyError):
    """No open session has this id."""


@dataclass(frozen=True)
class DialogueLine:
    """One answered line request. ``fallback``: an authored line (``fallback_reason`` says why:
    ``deadline``, ``model_error``, ``unusable``, ``repeat``, ``breaker_open``, ``cancelled``);
    ``cached_tokens``: prompt tokens whose keys/values came from the prefix block cache."""

    session_id: str
    text: str
    fallback: bool
    fallback_reason: str | None
    tokens: tuple[int, ...]
    latency_ms: float
    ttft_ms: float | None
    finish_reason: str
    seed: int
    attempts: int = 1
    cached_tokens: int = 0
    router_confidence: float | None = None
    served_by: str | None = None  # set by runtime.serving.model_router: a model's name or "authored"


@dataclass
class Session:
    """An NPC dialogue session: who speaks (archetype, persona), its state and context."""

    session_id: str
    npc: str
    persona: tuple[str, ...]
    state: str
    context: dict[str, str]
    npc_id: Any
    player_id: Any


class CircuitBreaker:
    """Closed -> open when, over the last ``window_s``, at least ``min_requests`` outcomes show an
    error rate above ``max_error_rate`` or a p95 latency above ``p95_budget_ms``; open ->
    half-open after ``cooldown_s``; half-open lets ``probes`` requests through: all fine (no
    error, latency within budget) closes it with a fresh window, any failure reopens it."""

    def __init__(self, *, p95_budget_ms: float, max_error_rate: float = 0.05, window_s: float = 60.0,
                 min_requests: int = 20, cooldown_s: float = 10.0, probes: int = 5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if p95_budget_ms <= 0 or not 0 <= max_error_rate < 1 or window_s <= 0 or probes < 1:
            raise ValueError("CircuitBreaker: need p95_budget_ms > 0, 0 <= max_error_rate < 1, "
                             "window_s > 0, probes >= 1")
        self.p95_budget_ms, self.max_error_rate = p95_budget_ms, max_error_rate
        self.window_s, self.min_requests, self.cooldown_s, self.probes = window_s, min_requests, cooldown_s, probes
        self.clock = clock
        self.state = "closed"
        self.reason: str | None = None
        self._window: deque[tuple[float, bool, float]] = deque()
        self._opened_at = 0.0
        self._probes_sent = 0
        self._probes_ok = 0

    def allow(self, critical: bool = False) -> bool:
        """May a request use the model now? Critical requests always may."""
        self._tick()
        if critical or self.state == "closed":
            return True
        if self.state == "half_open" and self._probes_sent < self.probes:
            self._probes_sent += 1
            return True
        return False

    def record(self, ok: bool, latency_ms: float) -> None:
        """One finished model request: ``ok`` (no error) and its latency."""
        now = self.clock()
        good = ok and latency_ms <= self.p95_budget_ms
        if self.state == "half_open":
            if not good:
                self._open(now, "probe failed")
                return
            self._probes_ok += 1
            if self._probes_ok >= self.probes:
                self.state, self.reason = "closed", None
                self._window.clear()
            return
        self._window.append((now, ok, latency_ms))
        self._trim(now)
        if self.state == "closed" and len(self._window) >= self.min_requests:
            errors = sum(1 for _, o, _ in self._window if not o)
            rate = errors / len(self._window)
            p95 = float(np.percentile([lat for _, _, lat in self._window], 95))
            if rate > self.max_error_rate:
                self._open(now, f"error rate {rate:.1%} > {self.max_error_rate:.0%}")
            elif p95 > self.p95_budget_ms:
                self._open(now, f"p95 {p95:.0f} ms > {self.p95_budget_ms:.0f} ms")

    def snapshot(self) -> dict[str, Any]:
        self._tick()
        n = len(self._window)
        errors = sum(1 for _, o, _ in self._window if not o)
        return {"state": self.state, "reason": self.reason, "window_requests": n,
                "error_rate": errors / n if n else 0.0}

    def _open(self, now: float, reason: str) -> None:
        self.state, self.reason, self._opened_at = "open", reason, now
        self._probes_sent = self._probes_ok = 0

    def _tick(self) -> None:
        now = self.clock()
        self._trim(now)
        if self.state == "open" and now - self._opened_at >= self.cooldown_s:
            self.state = "half_open"
            self._probes_sent = self._probes_ok = 0

    def _trim(self, now: float) -> None:
        while self._window and now - self._window[0][0] > self.window_s:
            self._window.popleft()


class PrefixHitWindow:
    """The prefix-cache hit rate of one engine over a sliding time window: the prefix tokens
    found in the block cache divided by those looked up, summed over the requests whose lookup
    happened in the last ``window_s`` seconds (each engine result counts once, a resample too).

    :meth:`rate` is None (unknown, not zero) while the window holds fewer than ``min_requests``
    lookups, or for an engine without a prefix cache (the onnxruntime engine): nothing is
    recorded then. :class:`runtime.serving.model_router.ModelRouter`'s capacity rule reads it."""

    def __init__(self, *, window_s: float = 30.0, min_requests: int = 20,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not window_s > 0 or min_requests < 1:
            raise ValueError(f"PrefixHitWindow: need window_s > 0 and min_requests >= 1, got "
                             f"{window_s!r}, {min_requests!r}")
        self.window_s, self.min_requests, self.clock = window_s, min_requests, clock
        self._window: deque[tuple[float, int, int]] = deque()
        self._queried = self._hits = 0
        self._lock = threading.Lock()

    def record(self, queried: int, hits: int) -> None:
        """One lookup: ``queried`` cacheable prompt tokens, ``hits`` of them found."""
        if queried <= 0:
            return
        with self._lock:
            now = self.clock()
            self._window.append((now, queried, hits))
            self._queried += queried
            self._hits += hits
            self._trim(now)

    def rate(self) -> float | None:
        """Hit tokens / queried tokens over the window, or None with too few lookups in it."""
        with self._lock:
            self._trim(self.clock())
            if len(self._window) < self.min_requests:
                return None
            return self._hits / self._queried

    def snapshot(self) -> dict[str, Any]:
        rate = self.rate()
        with self._lock:
            return {"hit_rate": rate, "requests": len(self._window), "window_s": self.window_s,
                    "min_requests": self.min_requests}

    def _trim(self, now: float) -> None:
        while self._window and now - self._window[0][0] > self.window_s:
            _, q, h = self._window.popleft()
            self._queried -= q
            self._hits -= h


class ServiceMetrics(EngineMetrics):
    """:class:`EngineMetrics` plus the serving metrics (see the module docstring)."""

    def __init__(self, model_name: str) -> None:
        super().__init__(model_name)
        r, labels = self.registry, ["model_name"]
        # the prefix cache is tiered here: hits carry the tier they came from
        r.unregister(self._hits)
        self._tier_hits = Counter("flashnpc_prefix_cache_hit_tokens",
                                  "Prefix tokens found in the prefix KV cache, by tier.", [*labels, "tier"],
                                  registry=r)
        self.tier_hits = {t: self._tier_hits.labels(model_name, t) for t in TIERS}
        self.running = Gauge("flashnpc_requests_running", "Requests in the running batch.", labels,
                             registry=r).labels(model_name)
        self.waiting = Gauge("flashnpc_requests_waiting", "Requests waiting for a batch slot.", labels,
                             registry=r).labels(model_name)
        self.batch_size = Histogram("flashnpc_batch_rows", "Rows per engine step.", labels, buckets=_BATCH_BUCKETS,
                                    registry=r).labels(model_name)
        self.itl = Histogram("flashnpc_inter_token_latency_seconds", "Time between consecutive tokens of a line.",
                             labels, buckets=_ITL_BUCKETS, registry=r).labels(model_name)
        self.rejected = Counter("flashnpc_requests_rejected", "Requests refused as busy (queue full).", labels,
                                registry=r).labels(model_name)
        self.sessions = Gauge("flashnpc_dialogue_sessions", "Open dialogue sessions.", labels,
                              registry=r).labels(model_name)
        self.breaker = Gauge("flashnpc_breaker_state", "Circuit breaker: 0 closed, 1 half-open, 2 open.", labels,
                             registry=r).labels(model_name)
        for reason in ("breaker_open", "capacity"):
            self._fallbacks.labels(model_name, reason)

    def prefix_query(self, tokens: int, hit: bool) -> None:  # pragma: no cover - tiered: use cache_delta
        raise NotImplementedError("the service records prefix cache use per tier (cache_delta)")

    def cache_delta(self, queried: int, hits: Mapping[str, int]) -> None:
        if queried:
            self.queries.inc(queried)
        for tier, n in hits.items():
            if n:
                self.tier_hits[tier].inc(n)


@dataclass(eq=False)
class _Pending:
    session: Session
    intent: str
    ids: list[int]
    slot_values: dict[str, str]
    blocked: list[int]
    banned: int  # the request's banned tags (WordConstraint.banned_bits)
    seed: int
    max_tokens: int
    critical: bool
    t0: float
    deadline: float
    future: asyncio.Future[DialogueLine]
    lane: str
    attempt: int = 0
    handle: Handle | None = None
    timer: asyncio.TimerHandle | None = None
    shown: str = ""
    tokens: list[int] = field(default_factory=list)
    on_piece: Callable[[str], None] | None = None


class _Lane:
    """One engine and the thread that steps it."""

    def __init__(self, name: str, engine: BatchedEngine, service: DialogueService) -> None:
        self.name, self.engine, self.service = name, engine, service
        self.wake = threading.Event()
        self.stopping = False
        self.tokens: list[tuple[_Pending, int]] = []  # streamed tokens of the current step
        self.thread = threading.Thread(target=self._loop, name=f"flashnpc-{name}", daemon=True)

    def _loop(self) -> None:
        svc = self.service
        last = svc._cache_snapshot(self.engine)
        while not self.stopping:
            if not self.engine.has_work():
                self.wake.wait(0.05)
                self.wake.clear()
                continue
            try:
                results = self.engine.step()
            except Exception:
                log.exception("engine step failed in lane %s", self.name)
                results = self.engine.fail_all()
            svc.metrics.batch_size.observe(self.engine.last_batch)
            now = svc._cache_snapshot(self.engine)
            if now != last:
                svc.metrics.cache_delta(now[0] - last[0], {t: now[1][i] - last[1][i] for i, t in enumerate(TIERS)})
                last = now
            # one hand-over to the event loop per step, not one per token: the loop thread
            # and this one share the GIL, and thousands of wake-ups a second slowed both
            tokens, self.tokens = self.tokens, []
            if tokens or results:
                svc._post(svc._on_step, tokens, results)


class StartClose:
    """``async with x:`` awaits ``x.start()`` on entry and ``x.close()`` on exit."""

    async def start(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class DialogueService(StartClose):
    """Dialogue sessions over a :class:`BatchedEngine`; see the module docstring."""

    def __init__(self, engine: BatchedEngine, *, fallbacks: FallbackBook, catalog: Mapping[str, Any],
                 slot_rules: SlotRules | None = None, slot_defaults: Mapping[str, str] | None = None,
                 solo_engine: BatchedEngine | None = None,
                 max_queue: int = 1024, max_sessions: int = 100_000, default_deadline_ms: float = 1000.0,
                 latency_budget_ms: float = 300.0, breaker: CircuitBreaker | None = None,
                 max_tokens: int = 48, temperature: float = DEFAULT_TEMPERATURE, top_k: int = 50,
                 top_p: float = DEFAULT_TOP_P,
                 repeat_window: int = 8, max_resamples: int = 1, min_mean_logprob: float | None = -5.0,
                 name: str = "flash", cpu_threads: int | None = 1, warm_up: bool = True,
                 prefix_window: PrefixHitWindow | None = None, trigrams: TrigramTable | None = None,
                 authored: AuthoredBook | None = None) -> None:
        if max_queue < 0 or max_sessions < 1 or default_deadline_ms <= 0:
            raise ValueError("DialogueService: need max_queue >= 0, max_sessions >= 1, default_deadline_ms > 0")
        self.engine = engine
        self.cpu_threads = cpu_threads
        self.warm_up = warm_up
        self.tokenizer = engine.tokenizer
        self.catalog = {k: (dict(v) if isinstance(v, Mapping) else list(v)) for k, v in catalog.items()}
        self.fallbacks = fallbacks
        self.slot_rules = slot_rules
        self.slot_defaults = dict(slot_defaults or {})
        self.trigrams = trigrams  # a line with a word trigram the book never says is drawn again
        self.authored = authored  # a fine-tune's studio lines, played back as LineGenerator does
        self._fit_cache = FitCache()
        self.max_queue, self.max_sessions = max_queue, max_sessions
        self.default_deadline_ms = default_deadline_ms
        self.latency_budget_ms = latency_budget_ms
        self.breaker = breaker or CircuitBreaker(p95_budget_ms=latency_budget_ms)
        self.max_tokens, self.temperature, self.top_k, self.top_p = max_tokens, temperature, top_k, top_p
        self.memory = RepeatMemory(repeat_window)
        self.max_resamples = max_resamples
        self.min_mean_logprob = min_mean_logprob
        self.prefix_window = prefix_window or PrefixHitWindow()
        self.metrics = ServiceMetrics(name)
        self.registry = self.metrics.registry
        self.metrics.set_active_params_percent(active_params_percent(vars(engine.config)))
        self._slot_ids = {s: self.tokenizer._slot_id[s] for s in self.catalog.get("slots", ())}
        self._sessions: dict[str, Session] = {}
        self._ids = itertools.count(1)
        self._pending: set[_Pending] = set()
        self._lanes = {"batch": _Lane("batch", engine, self)}
        if solo_engine is not None:
            self._lanes["solo"] = _Lane("solo", solo_engine, self)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done_times: deque[float] = deque(maxlen=512)
        self._started = False

    @classmethod
    def load(cls, model_dir: str | Path | None = None, *, checkpoint: str | Path | None = None,
             device: str = "cpu", dtype: str | None = None, max_batch: int = 256, cuda_graphs: bool = False,
             solo_lane: bool = True, engine: str = "auto", **options: Any) -> DialogueService:
        """Load the model for a service: the batched engine, a one-row engine for the opt-out lane
        over the same weights, the model directory's fallbacks, catalog and constraints.

        ``engine``: ``"ort"`` (:class:`runtime.serving.ort_engine.OrtBatchedEngine`, the shipped INT4
        graph through onnxruntime; CPU only, no checkpoint), ``"torch"``
        (:class:`BatchedEngine`) or ``"auto"``: onnxruntime on a CPU unless a checkpoint is
        given, PyTorch on a GPU."""
        from runtime.paths import DEFAULT_MODEL_DIR

        if engine not in ("auto", "ort", "torch"):
            raise ValueError(f"engine must be 'auto', 'ort' or 'torch', got {engine!r}")
        if engine == "auto":
            engine = "ort" if device == "cpu" and checkpoint is None else "torch"
        root = Path(model_dir) if model_dir is not None else DEFAULT_MODEL_DIR
        batched: BatchedEngine
        solo: BatchedEngine | None
        if engine == "ort":
            if device != "cpu" or checkpoint is not None:
                raise ValueError("engine='ort' runs the exported graph on a CPU (no device, no checkpoint)")
            from runtime.client.onnx_model import FlashOnnx
            from runtime.serving.ort_engine import OrtBatchedEngine

            threads = options.get("cpu_threads") or 1
            onnx = FlashOnnx.load(root, threads=threads)
            assert onnx.tokenizer is not None
            cons = read_constraints(root)
            words = cons.word_constraint(onnx.tokenizer)  # one set of masks for both lanes
            batched = OrtBatchedEngine(onnx, max_batch=max_batch, words=words)
            solo = OrtBatchedEngine(onnx, max_batch=1, words=words) if solo_lane else None
            tok = batched.tokenizer
        else:
            from runtime.serving.batched_engine import load_flash

            model, tok, root = load_flash(model_dir, checkpoint=checkpoint)
            cons = read_constraints(root)
            words = cons.word_constraint(tok)
            batched = BatchedEngine(model, tok, device=device, dtype=dtype, max_batch=max_batch,
                                    words=words, cuda_graphs=cuda_graphs)
            solo = (BatchedEngine(model, tok, device=device, dtype=dtype, max_batch=1, words=words,
                                  use_block_cache=False) if solo_lane else None)
        side = Path(root if model_dir is not None else DEFAULT_MODEL_DIR)
        fallbacks = (FallbackBook.from_json(side / "fallbacks.json") if (side / "fallbacks.json").is_file()
                     else FallbackBook.shipped())
        options.setdefault("authored", AuthoredBook.from_json(side / "authored.json")
                           if (side / "authored.json").is_file() else None)
        return cls(batched, fallbacks=fallbacks, catalog=tok.catalog, slot_rules=cons.slot_rules,
                   slot_defaults=cons.slot_defaults, solo_engine=solo, trigrams=cons.trigrams,
                   **options)

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the engine threads (call from the event loop that will await requests)."""
        if self._started:
            return
        self._loop = asyncio.get_running_loop()
        if self.cpu_threads and self.engine.device.type == "cpu":
            # process-wide; on a small shared machine one intra-op thread beats two whose team
            # stalls whenever another process takes a core
            torch.set_num_threads(self.cpu_threads)
        if self.warm_up:
            await asyncio.to_thread(self._warm_up)
        for lane in self._lanes.values():
            lane.thread.start()
        self._started = True

    def _warm_up(self) -> None:
        """A full batch of throwaway requests through every engine before the first real one:
        the first steps at a new batch size pay for allocations (onnxruntime's arena, torch's
        caching allocator), and in a load test those first slow steps opened the breaker."""
        cat = self.catalog
        ids, _ = self.tokenizer.encode_prompt(cat["archetypes"][0], (), cat["states"][0],
                                              cat["intents"][0], {})
        for lane in self._lanes.values():
            eng = lane.engine
            eng.generate([GenRequest(ids, seed=i, max_tokens=4, min_tokens=4) for i in range(eng.max_batch)])

    async def close(self) -> None:
        """Stop the engine threads; requests still pending get fallback lines (``cancelled``)."""
        for p in list(self._pending):
            self._finish_fallback(p, "cancelled")
        for lane in self._lanes.values():
            lane.stopping = True
            lane.wake.set()
        for lane in self._lanes.values():
            if lane.thread.is_alive():
                await asyncio.to_thread(lane.thread.join, 5.0)
        self._started = False

    # ------------------------------------------------------------ sessions

    def open_session(self, npc: str, *, state: str, persona: Sequence[str] = (),
                     context: Mapping[str, str] | None = None, npc_id: Any = None, player_id: Any = None,
                     session_id: str | None = None) -> str:
        """Open a session; returns its id. Unknown archetype, persona trait, state or context values
        raise ValueError listing the known ones."""
        if len(self._sessions) >= self.max_sessions:
            raise Busy(1000)
        persona_t = (persona,) if isinstance(persona, str) else tuple(persona)
        ctx = dict(context or {})
        self._validate(npc, persona_t, state, ctx)
        sid = session_id if session_id is not None else f"s{next(self._ids)}"
        if sid in self._sessions:
            raise ValueError(f"session id {sid!r} is already open")
        self._sessions[sid] = Session(sid, npc, persona_t, state, ctx, npc_id if npc_id is not None else sid,
                                      player_id)
        self.metrics.sessions.set(len(self._sessions))
        return sid

    def update_state(self, session_id: str, *, state: str | None = None, context: Mapping[str, str] | None = None,
                     persona: Sequence[str] | None = None) -> Session:
        """Change a session's state, persona and/or context (merged into the current context)."""
        s = self.session(session_id)
        new_state = s.state if state is None else state
        new_persona = s.persona if persona is None else ((persona,) if isinstance(persona, str) else tuple(persona))
        new_ctx = {**s.context, **(context or {})}
        self._validate(s.npc, new_persona, new_state, new_ctx)
        s.state, s.persona, s.context = new_state, new_persona, new_ctx
        return s

    def close_session(self, session_id: str) -> None:
        """Close a session; its pending requests are answered with fallback lines (``cancelled``)."""
        s = self.session(session_id)
        self.cancel_requests(s)
        del self._sessions[session_id]
        self.metrics.sessions.set(len(self._sessions))

    def cancel_requests(self, session: Session) -> int:
        """Answer ``session``'s pending requests here with fallback lines (``cancelled``); returns
        how many. For a session this service serves without holding it (see :meth:`request_line`)."""
        mine = [p for p in self._pending if p.session is session]
        for p in mine:
            self._finish_fallback(p, "cancelled")
        return len(mine)

    def session(self, session_id: str) -> Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionNotFound(f"no open dialogue session {session_id!r}") from None

    @property
    def num_sessions(self) -> int:
        return len(self._sessions)

    # ------------------------------------------------------------ requests

    async def request_line(self, session_id: str | Session, intent: str, *,
                           context: Mapping[str, str] | None = None,
                           seed: int | None = None, deadline_ms: float | None = None,
                           max_tokens: int | None = None, critical: bool = False, batch: bool = True,
                           on_piece: Callable[[str], None] | None = None,
                           authored: str | None = None) -> DialogueLine:
        """A line for the session's NPC answering ``intent``. Never raises for a valid request
        except :class:`Busy` (queue full); model trouble gives a fallback line. ``on_piece``:
        called with each new piece of text as it decodes (streaming); the pieces concatenate to
        the returned text unless it is a fallback. ``critical`` requests bypass an open breaker;
        ``batch=False`` runs in the opt-out lane. ``authored``: answer with an authored line
        at once, without the model, ``fallback_reason`` set to this (the capacity rule's
        ``capacity``).

        ``session_id`` may also be a :class:`Session` this service does not hold (another
        model's, served here by the capacity rule's fallback model): its archetype, persona,
        state and context must be this model's, else ValueError; :meth:`cancel_requests` ends
        its requests when it closes."""
        if not self._started or self._loop is None:
            raise RuntimeError("DialogueService.start() has not been awaited")
        s = session_id if isinstance(session_id, Session) else self.session(session_id)
        p = self._prepare(s, intent, context, seed, deadline_ms, max_tokens, critical, batch, on_piece)
        if authored is not None:
            self._finish_fallback(p, authored)
            return await p.future
        played = await self._played(p, context)
        if played is not None:
            self._finish_authored(p, *played)
            return await p.future
        if not self.breaker.allow(critical):
            self._finish_fallback(p, "breaker_open")
            self._update_breaker_gauge()
            return await p.future
        capacity = self.engine.max_batch + self.max_queue
        if len(self._pending) >= capacity:
            self.metrics.rejected.inc()
            raise Busy(self.retry_after_ms())
        self._pending.add(p)
        p.timer = self._loop.call_at(self._loop.time() + (p.deadline - time.perf_counter()), self._on_deadline, p)
        self._submit(p)
        return await p.future

    async def stream_line(self, session_id: str, intent: str, **kwargs: Any) -> AsyncIterator[str | DialogueLine]:
        """Like :meth:`request_line`, as an async iterator: text pieces (str) as they decode, then
        the :class:`DialogueLine`. A fallback line arrives as one piece (its whole text)."""
        queue: asyncio.Queue[str | DialogueLine] = asyncio.Queue()
        task = asyncio.ensure_future(self.request_line(session_id, intent, on_piece=queue.put_nowait, **kwargs))
        def done(t: asyncio.Future[DialogueLine]) -> None:
            if t.cancelled():
                queue.put_nowait(_Raise(asyncio.CancelledError()))  # type: ignore[arg-type]
            elif t.exception() is not None:
                queue.put_nowait(_Raise(t.exception()))  # type: ignore[arg-type]
            else:
                queue.put_nowait(t.result())

        task.add_done_callback(done)
        shown = False
        while True:
            item = await queue.get()
            if isinstance(item, _Raise):
                raise item.exc
            if isinstance(item, DialogueLine):
                if item.fallback and not shown:
                    yield item.text
                yield item
                return
            shown = True
            yield item

    def health(self) -> dict[str, Any]:
        """``status`` is ``degraded`` while the breaker is not closed, else ``ok``."""
        snap = self.breaker.snapshot()
        self._update_breaker_gauge()
        return {"status": "ok" if snap["state"] == "closed" else "degraded", "breaker": snap,
                "sessions": len(self._sessions), "running": self.engine.num_running,
                "waiting": self.engine.num_waiting, "in_flight": len(self._pending),
                "prefix_cache": self.prefix_window.snapshot()}

    def exposition(self) -> bytes:
        """The service's metrics in the Prometheus text format."""
        self.refresh_gauges()
        return self.metrics.exposition()

    def refresh_gauges(self) -> None:
        """Set the gauges that are read on demand (running, waiting, breaker) before a scrape."""
        self.metrics.running.set(sum(lane.engine.num_running for lane in self._lanes.values()))
        self.metrics.waiting.set(sum(lane.engine.num_waiting for lane in self._lanes.values()))
        self._update_breaker_gauge()

    # ------------------------------------------------------------ internals

    def _validate(self, npc: str, persona: tuple[str, ...], state: str, context: Mapping[str, str]) -> None:
        closed = {k: v for k, v in context.items() if k not in self._slot_ids}
        for k, v in context.items():
            if k in self._slot_ids and not isinstance(v, str):
                raise ValueError(f"slot value for {k!r} must be a string, got {v!r}")
        self.tokenizer.encode_prompt(npc, persona, state, self.catalog["intents"][0], closed)

    def _prepare(self, s: Session, intent: str, context: Mapping[str, str] | None, seed: int | None,
                 deadline_ms: float | None, max_tokens: int | None, critical: bool, batch: bool,
                 on_piece: Callable[[str], None] | None) -> _Pending:
        ctx = {**s.context, **(context or {})}
        closed = {k: v for k, v in ctx.items() if k not in self._slot_ids}
        slot_values = {**self.slot_defaults, **{k: v for k, v in ctx.items() if k in self._slot_ids}}
        ids, _ = self.tokenizer.encode_prompt(s.npc, s.persona, s.state, intent, closed)
        allowed = set(self._slot_ids)
        if self.slot_rules is not None:
            allowed &= self.slot_rules.allowed(s.npc, s.state, intent)
        blocked = [tid for slot, tid in self._slot_ids.items() if slot not in allowed or slot not in slot_values]
        if deadline_ms is not None and not deadline_ms >= 0:
            raise ValueError(f"deadline_ms must be >= 0, got {deadline_ms!r}")
        n = self.max_tokens if max_tokens is None else max_tokens
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        t0 = time.perf_counter()
        deadline = t0 + (self.default_deadline_ms if deadline_ms is None else deadline_ms) / 1e3
        if seed is None:
            seed = int(np.random.default_rng().integers(2**31))
        assert self._loop is not None
        lane = "batch" if batch or "solo" not in self._lanes else "solo"
        banned = self.engine.words.banned_bits(s.npc, s.persona, closed)
        return _Pending(s, intent, ids, slot_values, blocked, banned, int(seed), n, critical, t0, deadline,
                        self._loop.create_future(), lane, on_piece=on_piece)

    def _submit(self, p: _Pending) -> None:
        lane = self._lanes[p.lane]
        req = GenRequest(p.ids, seed=p.seed, attempt=p.attempt, max_tokens=p.max_tokens,
                         temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                         blocked_tokens=p.blocked, banned=p.banned, tag=p,
                         on_token=(lambda tok, t, p=p: lane.tokens.append((p, tok))) if p.on_piece else None)
        p.tokens = []
        p.handle = lane.engine.submit(req)
        lane.wake.set()

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop is closing
                loop.call_soon_threadsafe(fn, *args)

    def _on_step(self, tokens: list[tuple[_Pending, int]], results: list[GenResult]) -> None:
        for p, tok in tokens:
            self._on_token(p, tok)
        if results:
            self._on_results(results)

    def _on_token(self, p: _Pending, tok: int) -> None:
        if p.future.done() or p.on_piece is None:
            return
        p.tokens.append(tok)
        # a word still being spelled shows once it is complete (a dead end may cut it)
        raw = settled_text(without_broken_bytes(self.tokenizer.decode(p.tokens))).strip()
        if not p.shown and usable(raw) is not None:
            return
        text = fill_slots(raw, p.slot_values)
        if len(text) > len(p.shown) and text.startswith(p.shown):
            piece, p.shown = text[len(p.shown):], text
            p.on_piece(piece)

    def _on_deadline(self, p: _Pending) -> None:
        if p.future.done():
            return
        if p.handle is not None:
            self._lanes[p.lane].engine.cancel(p.handle)
        if p.shown:  # text is out already: the line ends there
            self._finish_line(p, p.shown, tuple(p.tokens), "deadline", None, 0)
            return
        self.breaker.record(False, (time.perf_counter() - p.t0) * 1e3)
        self._finish_fallback(p, "deadline")

    def _on_results(self, results: list[GenResult]) -> None:
        for res in results:
            p = res.request.tag
            if not isinstance(p, _Pending):
                continue
            cache = self._lanes[p.lane].engine.block_cache
            if cache is not None and res.finish not in ("error", "cancelled"):
                # what the engine looked up: the prompt's full blocks before its last token
                bt = cache.block_tokens
                self.prefix_window.record((len(res.request.ids) - 1) // bt * bt, res.cached_tokens)
            if p.future.done():
                continue
            if res.finish == "error":
                self.breaker.record(False, (time.perf_counter() - p.t0) * 1e3)
                self._finish_fallback(p, "model_error", res)
                continue
            if res.finish == "cancelled":
                continue
            for a, b in zip(res.token_times, res.token_times[1:]):
                self.metrics.itl.observe(b - a)
            raw = without_broken_bytes(self.tokenizer.decode(res.tokens))
            if res.finish == "blocked":  # a dead end inside a word: the line ends at its last complete word
                raw = settled_text(raw)
            raw = raw.strip()
            if p.shown:
                self._finish_line(p, raw, tuple(res.tokens), res.finish, res, p.attempt + 1)
                continue
            guessing = (self.min_mean_logprob is not None and res.mean_logprob is not None
                        and res.mean_logprob < self.min_mean_logprob)
            # a word trigram the book never says, or a sentence said twice (runtime.client.repeats)
            stitched = ((self.trigrams is not None and self.trigrams.first_unseen(raw) is not None)
                        or repeated_sentence(raw) is not None)
            why = "unusable" if usable(raw) is not None or guessing or res.finish == "blocked" or stitched else None
            if why is None and self.memory.said_recently(p.session.npc_id, raw):
                why = "repeat"
            if why is None:
                self._finish_line(p, raw, tuple(res.tokens), res.finish, res, p.attempt + 1)
            elif ((why == "repeat" or res.finish == "blocked" or stitched) and p.attempt < self.max_resamples
                  and time.perf_counter() < p.deadline):
                p.attempt += 1
                self._submit(p)
            else:
                self.breaker.record(True, (time.perf_counter() - p.t0) * 1e3)
                self._finish_fallback(p, why, res)

    def _finish_line(self, p: _Pending, raw: str, tokens: tuple[int, ...], finish: str, res: GenResult | None,
                     attempts: int) -> None:
        self.memory.remember(p.session.npc_id, raw)
        text = fill_slots(raw, p.slot_values)
        if p.on_piece is not None and p.shown and len(text) > len(p.shown) and text.startswith(p.shown):
            # the stream shows settled text only: a line that ends (by length) inside its last
            # word sends that word now, so the pieces always add up to the line
            piece, p.shown = text[len(p.shown):], text
            p.on_piece(piece)
        latency = (time.perf_counter() - p.t0) * 1e3
        ttft = None if res is None or res.ttft_s is None else (res.token_times[0] - p.t0) * 1e3
        line = DialogueLine(p.session.session_id, text, False, None, tokens, latency,
                            ttft, finish, p.seed, attempts, 0 if res is None else res.cached_tokens,
                            None if res is None else res.router_confidence)
        self.breaker.record(True, latency)
        self.metrics.line(fallback=False, reason=None, latency_s=latency / 1e3,
                          ttft_s=None if ttft is None else ttft / 1e3, tokens=len(tokens),
                          router_confidence=line.router_confidence)
        self._resolve(p, line)

    async def _played(self, p: _Pending, context: Mapping[str, str] | None) -> tuple[str, str] | None:
        """(text, finish reason) of the studio's line to play back, as
        :meth:`runtime.client.generator.LineGenerator._played` chooses it: the cell's own
        (``authored``), else the same move in a near state chosen by state fit
        (``authored_near``; with the onnxruntime engine, the CPU default, whose graph scores
        lines; the PyTorch engine goes to the model instead), else None."""
        if self.authored is None:
            return None
        s = p.session
        closed = {k: v for k, v in {**s.context, **(context or {})}.items() if k not in self._slot_ids}
        rng = np.random.default_rng([p.seed, 104729])
        words = self.engine.words

        def usable(ln: Any) -> bool:
            return not self.memory.said_recently(s.npc_id, ln.text) and not words.says_banned(ln.text, p.banned)

        ask = (s.npc, s.state, p.intent, s.persona, closed)
        own = self.authored.choose(*ask, slots=p.slot_values, rng=rng, usable=usable)
        if own is not None:
            return own.text, "authored"
        model = getattr(self.engine, "model", None)
        near = self.authored.near(*ask, slots=p.slot_values, usable=usable) if isinstance(model, FlashOnnx) else []
        if not near:
            return None
        tok = self.tokenizer
        prompts = [tok.encode_prompt(s.npc, s.persona, ln.state, p.intent, closed)[0] for ln in near]
        lines = [[*tok.encode(ln.text), tok.eos_id] for ln in near]
        fit = await asyncio.to_thread(state_fit, model, self._fit_cache, p.ids, prompts, lines)
        return AuthoredBook.choose_fitting(near, fit, rng).text, "authored_near"

    def _finish_authored(self, p: _Pending, raw: str, finish: str) -> None:
        self.memory.remember(p.session.npc_id, raw)
        text = fill_slots(raw, p.slot_values)
        if p.on_piece is not None:
            p.shown = text
            p.on_piece(text)
        latency = (time.perf_counter() - p.t0) * 1e3
        line = DialogueLine(p.session.session_id, text, False, None, (), latency, None, finish, p.seed, 0)
        self.metrics.line(fallback=False, reason=None, latency_s=latency / 1e3, ttft_s=None, tokens=0,
                          router_confidence=None)
        self._resolve(p, line)

    def _finish_fallback(self, p: _Pending, reason: str, res: GenResult | None = None) -> None:
        if p.future.done():
            return
        if p.handle is not None and reason in ("cancelled", "deadline"):
            self._lanes[p.lane].engine.cancel(p.handle)
        rng = np.random.default_rng([p.seed, 7919])
        text = self.fallbacks.pick(p.session.npc, p.session.state, p.session.npc_id, rng, intent=p.intent)
        latency = (time.perf_counter() - p.t0) * 1e3
        line = DialogueLine(p.session.session_id, text, True, reason, (), latency, None, "fallback", p.seed,
                            p.attempt + (res is not None), 0 if res is None else res.cached_tokens)
        self.metrics.line(fallback=True, reason=reason, latency_s=latency / 1e3, ttft_s=None,
                          tokens=0 if res is None else len(res.tokens), router_confidence=None)
        self._resolve(p, line)

    def _resolve(self, p: _Pending, line: DialogueLine) -> None:
        if p.timer is not None:
            p.timer.cancel()
        self._pending.discard(p)
        self._done_times.append(time.perf_counter())
        if not p.future.done():
            p.future.set_result(line)
        self._update_breaker_gauge()

    def retry_after_ms(self) -> int:
        """Time for the queue ahead to drain at the recent line rate, 10 ms .. 10 s."""
        times = self._done_times
        if len(times) >= 2 and times[-1] > times[0]:
            rate = (len(times) - 1) / (times[-1] - times[0])
            ms = 1e3 * max(1, len(self._pending) - self.engine.max_batch) / rate
        else:
            ms = self.default_deadline_ms
        return int(min(10_000, max(10, ms)))

    def _update_breaker_gauge(self) -> None:
        self.metrics.breaker.set(BREAKER_STATES[self.breaker.state])

    @staticmethod
    def _cache_snapshot(engine: BatchedEngine) -> tuple[int, tuple[int, ...]]:
        c = engine.block_cache
        if c is None:
            return 0, (0,) * len(TIERS)
        return c.stats.queried_tokens, tuple(c.stats.hits[t] for t in TIERS)


@dataclass
class _Raise:
    exc: BaseException


__all__ = ["BREAKER_STATES", "Busy", "CircuitBreaker", "DialogueLine", "DialogueService", "ServiceMetrics",
           "Session", "SessionNotFound", "StartClose"]
