"""The local line engine a game client calls whenever an NPC speaks: :class:`LineGenerator`.

It runs the exported Flash model with onnxruntime on the player's CPU (one quiet intra-op
thread by default, see :func:`runtime.client.onnx_model.session_options`) and always returns a
:class:`Line` on time: when the model misses the deadline, fails, or says something unusable
or repeated, an authored fallback line from the line book is returned instead, one written for
the NPC's archetype and state and the player's intent (:mod:`runtime.client.fallback`), marked
``fallback=True``. A valid request never gets silence or an exception.

Per request::

    prompt = <bos> <arch> <persona>... <state> | <intent> <ctx>... <line>
             '------- invariant prefix -------'
    prefix keys/values  <- PrefixCache (L1 memory LRU, optional L2 disk), computed on a miss
    suffix              -> one model step on top of the cached prefix
    then one token per step with the KV cache, sampling (runtime.client.sampling.sample_next) from
    logits where the word constraints (runtime.client.constraints.WordConstraint: the model's
    vocabulary, banned words, other tags' signature phrases), control tokens and unfillable
    slots are masked to -inf

Several requests are decoded together by :meth:`LineGenerator.generate_batch` (stacked
keys/values, rows of different lengths left-padded and masked, lock-step decoding); a single
request is a batch of one. The loop itself is :func:`runtime.client.onnx_model.decode_rows`, shared
with :meth:`runtime.client.onnx_model.FlashOnnx.generate_ids` and the evaluation's batched sampling.

Thread safety: every public method may be called from several threads at once.

asyncio: :meth:`LineGenerator.agenerate` and :meth:`LineGenerator.astream` are the same engine for
an event loop: the request runs on the worker threads :meth:`LineGenerator.submit` uses and the
result (or each piece) comes back through the loop, so a coroutine awaits a line without
blocking the loop; cancelling the awaiting task cancels the request.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import (
    AsyncIterator,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from runtime.client.authored import AuthoredBook
from runtime.client.bigrams import BigramTable
from runtime.client.constraints import (
    Constraints,
    MaskParts,
    RepeatMemory,
    SlotRules,
    WordConstraint,
    WordState,
    check_sampling,
    constraints_file,
    fill_slots,
    normalise_line,
    read_constraints,
    restart_point,
    settled_text,
    stop_index,
    usable,
    without_broken_bytes,
)
from runtime.client.errors import BundleError, ModelLoadError
from runtime.client.fallback import FallbackBook
from runtime.client.line_fit import FitCache, state_fit
from runtime.client.metrics import EngineMetrics
from runtime.client.onnx_model import DEFAULT_MODEL_DIR, FlashOnnx, decode_rows
from runtime.client.prefix_cache import PrefixCache
from runtime.client.repeats import ENDS_A_SENTENCE, repeated_sentence
from runtime.client.sampling import DEFAULT_TEMPERATURE, DEFAULT_TOP_P, sample_next
from runtime.client.signature import PublicKey
from runtime.client.trigrams import TrigramReader, TrigramTable, tokens_through
from runtime.tokenizer import check_request

log = logging.getLogger("flashnpc.runtime")

KV = list[np.ndarray]


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Line:
    """One NPC line.

    ``text``: the line with slots filled; ``raw_text``: as decoded, ``{slot}`` markers kept;
    ``tokens``: the generated token ids (without ``eos``; empty for a fallback);
    ``latency_ms``: request start (the call, or :meth:`LineGenerator.submit`) to the line;
    ``ttft_ms``: request start to the first decoded token (None if none was decoded);
    ``prefix_cache_hit``: the prompt prefix's keys/values came from the cache;
    ``fallback`` / ``fallback_reason``: an authored line was returned, and why (``deadline``,
    ``model_error``, ``unusable``, ``repeat``, ``model_unavailable``, ``cancelled`` by
    :meth:`LineGenerator.close`);
    ``finish_reason``: ``eos``, ``length``, ``stop``, ``deadline``, ``error``, ``fallback``,
    ``blocked`` (the word constraints left no token: the line ends at its last complete word),
    ``authored`` (a line the studio's writers wrote for the request's cell, played back:
    :mod:`runtime.client.authored`; no tokens decoded, ``fallback`` False), ``authored_near``
    (the studio's line for the same move in a near state, chosen by the model for the state:
    :meth:`LineGenerator._played`);
    ``active_params_pct``: share of the model's parameters a decoded token touches;
    ``router_confidence``: mean top-1 router probability over the decoded tokens' MoE layers;
    ``seed``: the seed used (pass it back to reproduce the line); ``attempts``: samples drawn;
    ``mean_logprob``: mean log-probability the model gave its sampled tokens (None if none).
    """

    text: str
    tokens: tuple[int, ...]
    latency_ms: float
    ttft_ms: float | None
    prefix_cache_hit: bool
    fallback: bool
    active_params_pct: float
    router_confidence: float | None
    fallback_reason: str | None = None
    finish_reason: str = "eos"
    raw_text: str = ""
    seed: int | None = None
    attempts: int = 1
    mean_logprob: float | None = None


@dataclass(frozen=True)
class LineRequest:
    """A line request (the keyword arguments of :meth:`LineGenerator.generate`).

    ``context`` mixes closed-vocabulary values (``{"time_of_day": "night"}``) and free-text slot
    values (``{"player": "Aria"}``), which fill ``{player}`` after decoding. ``npc_id`` and
    ``player_id`` key the repeat memory and the no-same-fallback-twice rule (default: the
    archetype). ``domain`` picks the prefix cache TTL. ``batch=False`` opts a request out of
    batching in :meth:`LineGenerator.generate_batch`. ``None`` sampling values take the
    generator's defaults.
    """

    npc: str
    state: str
    persona: Sequence[str] | None = None
    intent: str = "approach"
    context: Mapping[str, str] | None = None
    seed: int | None = None
    max_tokens: int = 48
    min_tokens: int = 0
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    deadline_ms: float | None = None
    npc_id: Any = None
    player_id: Any = None
    domain: str = "default"
    stop: Sequence[str] = ()
    batch: bool = True


@dataclass
class _Prepared:
    """A validated request, encoded."""

    req: LineRequest
    ids: list[int]
    prefix_len: int
    slot_values: dict[str, str]
    slot_block: np.ndarray | None  # token ids of slots the line must not use
    banned: int | None  # the request's banned tags (WordConstraint.banned_bits)
    temperature: float
    top_p: float
    top_k: int
    seed: int
    t0: float
    deadline: float | None  # perf_counter seconds

    @property
    def memory_key(self) -> tuple[Any, Any]:
        return (self.req.npc_id if self.req.npc_id is not None else self.req.npc, self.req.player_id)


@dataclass
class _Row:
    """One sequence being decoded."""

    prep: _Prepared
    rng: np.random.Generator
    budget: int
    tokens: list[int] = field(default_factory=list)
    state: WordState = field(default_factory=WordState)
    states: list[WordState] = field(default_factory=list)  # the state after each token
    router: list[np.ndarray] = field(default_factory=list)  # [n_moe, n_expert] per token fed
    scored: list[np.ndarray] = field(default_factory=list)  # the logits each token was drawn from
    ttft: float | None = None
    finish: str | None = None
    cut: int = -1  # character index of a stop string in the decoded text
    hit: bool = False
    vetoed: bool = False  # the sample was abandoned (runtime.client.constraints.vetoed)
    reader: TrigramReader = field(default_factory=TrigramReader)  # its trigrams read so far
    text: str = ""  # the decoded text of the first ``text_n`` tokens (LineGenerator._text)
    text_n: int = 0
    redraw_at: int | None = None  # a trigram stop: the tokens up to the one that completed it
    parts: MaskParts | None = None  # the next position's masks, made while the model ran (pipelined)


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values), q)) if len(values) else None


def active_params_percent(config: Mapping[str, Any]) -> float:
    """Share (percent) of a Flash model's parameters a decoded token touches (see model.num_params)."""
    d, v, b = int(config["n_embd"]), int(config["vocab_size"]), int(config["block_size"])
    n_layer, e, h = int(config["n_layer"]), int(config["n_expert"]), int(config["expert_hidden"])
    k, every = int(config.get("top_k", 1)), int(config.get("moe_every", 1))
    total = v * d + b * d + d
    unused = 0
    for i in range(n_layer):
        total += 2 * d + 4 * d * d
        if i % every == every - 1:
            total += d * e + 2 * e * h * d
            unused += 2 * h * d * (e - k)
        else:
            total += 8 * d * d
    return 100.0 * (total - unused) / total


# --------------------------------------------------------------------------- engine


class LineGenerator:
    """NPC lines from an exported Flash model, with prefix caching, constraints and fallbacks.

    Build one with :meth:`load`. ``model`` may be None (fallback-only mode: every line is an
    authored fallback with reason ``model_unavailable``). ``banned_words``, ``vocabulary`` and
    ``signatures`` make the word constraints (:class:`runtime.client.constraints.WordConstraint`,
    ``self.mask``); a request bans the signatures of the tags it did not ask for. ``voice``
    (``constraints.json``'s ``voice_bonus`` when loaded): the logit bonus that makes the tags it
    asked for audible (:meth:`runtime.client.constraints.WordConstraint.voice_bonus`). ``bigrams``
    (``constraints.json``'s ``bigrams`` when loaded; :class:`runtime.client.bigrams.BigramTable`):
    words inside a sentence piece only follow the words the book has them follow. ``trigrams``
    (``constraints.json``'s ``trigrams`` when loaded; :class:`runtime.client.trigrams.TrigramTable`):
    a sample stops the moment its text holds a word trigram the book never says (a word is
    judged once complete, before a stream shows it) and is drawn again from the sentence before
    it, as a veto is (``max_resamples``, then a fallback).

    ``pipelined=True``: while the model computes a token's logits, the word constraints' state
    after the token fed and the masks of the next position (everything of them that needs no
    logits: :meth:`runtime.client.constraints.WordConstraint.prepare`) are made on a mask thread
    (one pool per generator, ``workers + 1`` threads, started on first use and stopped by
    :meth:`close` or when the generator is collected); the lines are the same as with the
    default, ``pipelined=False``, which does that work between the model's steps. On the
    2-core machines measured (BENCHMARKS.md, "Word constraints: the pipelined decode loop")
    the thread hand-offs and the model's slower steps beside the mask thread cost more than
    the masks it hides, unless other processes load the machine.
    """

    def __init__(self, model: FlashOnnx | None, *, catalog: Mapping[str, Any], fallbacks: FallbackBook,
                 banned_words: Iterable[str] = (), slot_rules: SlotRules | None = None,
                 vocabulary: Iterable[str] | None = None, signatures: Mapping[str, Iterable[str]] | None = None,
                 prefix_cache: PrefixCache | None = None, use_prefix_cache: bool = True,
                 name: str = "flash", temperature: float = DEFAULT_TEMPERATURE, top_p: float = DEFAULT_TOP_P,
                 top_k: int = 0,
                 repeat_window: int = 8, max_resamples: int = 2, workers: int = 1,
                 slot_defaults: Mapping[str, str] | None = None, min_mean_logprob: float | None = -5.0,
                 voice: Mapping[str, float] | None = None, bigrams: BigramTable | None = None,
                 trigrams: TrigramTable | None = None, pipelined: bool = False,
                 authored: AuthoredBook | None = None) -> None:
        check_sampling(temperature, top_k, top_p, 1)
        if max_resamples < 0 or workers < 1:
            raise ValueError(f"max_resamples must be >= 0 and workers >= 1, got {max_resamples}, {workers}")
        self.model = model
        self.name = name
        self._catalog = {k: (dict(v) if isinstance(v, Mapping) else list(v)) for k, v in catalog.items()}
        self.fallbacks = fallbacks
        self.authored = authored
        self._fit_cache = FitCache()
        self.slot_rules = slot_rules
        self.banned_words = list(banned_words)
        self.temperature, self.top_p, self.top_k = float(temperature), float(top_p), int(top_k)
        self.max_resamples = max_resamples
        self.min_mean_logprob = min_mean_logprob
        self._step_s = 0.0  # running estimate of one decode step, for deadline decisions
        self.workers = workers
        self.slot_defaults = dict(slot_defaults or {})
        self.use_prefix_cache = use_prefix_cache
        self.trigrams = trigrams
        self.pipelined = pipelined
        self._mask_pool: ThreadPoolExecutor | None = None  # the pipelined masks' threads (_masks)
        self.memory = RepeatMemory(repeat_window)
        self.metrics = EngineMetrics(name)
        self.metrics_registry = self.metrics.registry
        if model is not None:
            tok = model.tokenizer
            if tok is None:
                raise ValueError("the model has no tokenizer")
            self.tokenizer = tok
            self.prefix_cache = prefix_cache if prefix_cache is not None else PrefixCache(
                fingerprint=self._fingerprint())
            self.mask = WordConstraint(self.banned_words, tok, vocabulary=vocabulary, signatures=signatures,
                                       voice=voice, bigrams=bigrams)
            self.active_params_pct = active_params_percent(model.config)
            self._slot_ids = {s: tok._slot_id[s] for s in tok.catalog["slots"]}
        else:
            self.prefix_cache = prefix_cache if prefix_cache is not None else PrefixCache()
            self.active_params_pct = 0.0
        self.metrics.set_active_params_percent(self.active_params_pct)
        self._seed_lock = threading.Lock()
        self._seed_rng = np.random.default_rng()
        self._stats_lock = threading.Lock()
        self._latencies: deque[float] = deque(maxlen=2048)
        self._ttfts: deque[float] = deque(maxlen=2048)
        self._counts: dict[str, int] = {"lines": 0, "model_lines": 0, "fallback_lines": 0, "authored_lines": 0,
                                        "tokens": 0, "resamples": 0}
        self._reasons: dict[str, int] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._pending: dict[Future[Line], _Prepared] = {}
        self._done: deque[Future[Line]] = deque()
        self._async_lock = threading.Lock()
        self.load_ms: float | None = None

    # ------------------------------------------------------------ loading

    @classmethod
    def load(cls, path: str | Path | None = None, *, file: str = "model.int4.onnx", threads: int = 1,
             cache_dir: str | Path | None = None, cache_bytes: int = 32 * 1024 * 1024,
             cache_ttl: Mapping[str, float | None] | None = None, default_ttl: float | None = None,
             on_error: str = "raise", warmup: bool = True, public_key: PublicKey | None = None,
             freeze_gc: bool = False, **options: Any) -> LineGenerator:
        """Load a model directory (default: the shipped ``runtime/assets/flash/``) and warm it up.

        ``path`` may also be a mobile bundle from ``flashnpc export mobile`` (a directory with
        ``manifest.json``, or its zip): it is verified and its ORT-format model loaded (see
        :mod:`runtime.client.bundle`); a bundle that fails any check raises :class:`BundleError`
        (a :class:`ModelLoadError`) naming the file and the reason, whatever ``on_error`` says.
        ``public_key`` (Ed25519; raw bytes, hex or PEM): load only a bundle that key signed.
        ``file``: which graph (``model.int4.onnx`` shipped, ``model.onnx`` fp32; ignored for a
        bundle). ``threads``: onnxruntime intra-op threads. ``cache_dir``: the prefix cache's
        disk tier (L2), whose fresh entries are preloaded; ``cache_bytes`` the memory tier's
        budget; ``cache_ttl`` per-domain TTLs in seconds (``default_ttl`` for the rest).
        ``on_error="fallback"``: if the model cannot be loaded, log the error and serve
        authored fallback lines only, from the bundle's verified files or the shipped ones
        (``"raise"``, the default, raises :class:`ModelLoadError` naming the file).
        ``freeze_gc``: once loaded and warmed up, collect the garbage and freeze every object
        the process then holds (:func:`gc.freeze`, process-wide: the game's objects too), so
        Python's full collections no longer walk the engine's tables (one engine loaded, after
        320 lines: ~53-68 ms of CPU a full collection without, ~23 ms with; one came in those
        320 lines, inside a line); the price: an object alive then that later dies in a
        reference cycle is never freed. Other keyword options go to :class:`LineGenerator`.
        """
        if on_error not in ("raise", "fallback"):
            raise ValueError(f"on_error must be 'raise' or 'fallback', got {on_error!r}")
        t0 = time.perf_counter()
        source = Path(path) if path is not None else DEFAULT_MODEL_DIR
        model: FlashOnnx | None
        root, file, bundled = _resolve_bundle(source, file, public_key)
        try:
            try:
                model = _load_model(root, file, threads)
            except ModelLoadError:
                if on_error == "raise":
                    raise
                log.exception("model at %s failed to load; serving fallback lines only", root)
                model = None
            catalog, cons, fallbacks = _read_side_files(root, source if bundled else None,
                                                        lenient=on_error == "fallback", model=model)
            options.setdefault("authored", _read_authored(root, source if bundled else None))
        except BaseException:
            _release(root)
            raise
        options.setdefault("name", root.name or "flash")
        fingerprint = _fingerprint(model, root / file) if model is not None else ""
        cache = PrefixCache(max_bytes=cache_bytes, disk_dir=cache_dir, default_ttl=default_ttl,
                            ttl_seconds=cache_ttl, fingerprint=fingerprint)
        options.setdefault("slot_defaults", cons.slot_defaults)
        options.setdefault("voice", cons.voice)
        options.setdefault("bigrams", cons.bigrams)
        options.setdefault("trigrams", cons.trigrams)
        gen = cls(model, catalog=catalog, fallbacks=fallbacks, banned_words=cons.banned_words,
                  slot_rules=cons.slot_rules, vocabulary=cons.vocabulary, signatures=cons.signatures,
                  prefix_cache=cache, **options)
        if cache_dir is not None:
            cache.preload()
        if warmup:
            gen.warmup()
        if freeze_gc:
            gc.collect()
            gc.freeze()
        gen.load_ms = (time.perf_counter() - t0) * 1e3
        return gen

    @classmethod
    def fallback_only(cls, path: str | Path | None = None, **options: Any) -> LineGenerator:
        """A generator that loads no model: every line is an authored fallback (reason
        ``model_unavailable``), and no model math runs — for a server that runs NPC trees but
        leaves lines to its clients, or tools that need the catalog only.

        The catalog, fallback lines, banned words and slot rules come from ``path`` as with
        :meth:`load` (default: the shipped ``runtime/assets/flash/``; a mobile bundle works
        too), so the generator accepts exactly the requests a loaded one would. Unlike
        ``load(on_error="fallback")``, which serves fallbacks only when the model fails to
        load, this never reads the graph. Raises :class:`ModelLoadError` if ``path`` does not
        exist or its fallback lines are unreadable. Keyword options go to
        :class:`LineGenerator`.
        """
        t0 = time.perf_counter()
        source = Path(path) if path is not None else DEFAULT_MODEL_DIR
        root, _, bundled = _resolve_bundle(source, "model.int4.onnx", None)
        if not root.is_dir():
            raise ModelLoadError(f"{root}: not a model directory or bundle")
        try:
            catalog, cons, fallbacks = _read_side_files(root, source if bundled else None, lenient=False,
                                                        model=None)
            options.setdefault("authored", _read_authored(root, source if bundled else None))
        except BaseException:
            _release(root)
            raise
        options.setdefault("name", root.name or "flash")
        gen = cls(None, catalog=catalog, fallbacks=fallbacks, banned_words=cons.banned_words,
                  slot_rules=cons.slot_rules, **options)
        gen.load_ms = (time.perf_counter() - t0) * 1e3
        return gen

    def _fingerprint(self) -> str:
        assert self.model is not None
        return f"{id(self.model.session):x}"

    def warmup(self) -> None:
        """Run one short request end to end (session, masks, sampler), unrecorded, so the first
        real request is no slower than later ones."""
        if self.model is None:
            return
        cat = self._catalog
        req = LineRequest(cat["archetypes"][0], cat["states"][0], intent=cat["intents"][0], seed=0,
                          max_tokens=4, npc_id=("__warmup__",))
        prep = self._prepare(req, time.perf_counter())
        self.mask.precompute()
        for _ in self._decode([self._new_row(prep, prep.seed)], use_cache=False):
            pass

    # ------------------------------------------------------------ public API

    def catalog(self) -> dict[str, Any]:
        """What the model understands: archetypes, persona_traits, states, intents, context
        ({slot: [values]}) and slots (free-text ones, filled after decoding)."""
        return {k: (dict((s, list(vs)) for s, vs in v.items()) if isinstance(v, dict) else list(v))
                for k, v in self._catalog.items()}

    def generate(self, npc: str, state: str, *, persona: Sequence[str] | None = None, intent: str = "approach",
                 context: Mapping[str, str] | None = None, seed: int | None = None, max_tokens: int = 48,
                 temperature: float | None = None, top_p: float | None = None, deadline_ms: float | None = None,
                 **more: Any) -> Line:
        """One line for ``npc`` (an archetype) in ``state``; never raises for a valid request.

        Invalid values (unknown archetype, state, persona trait, intent, context slot or value,
        out-of-range sampling parameters) raise ValueError listing what is known. More keyword
        arguments: those of :class:`LineRequest` (``top_k``, ``min_tokens``, ``npc_id``,
        ``player_id``, ``domain``, ``stop``).
        """
        t0 = time.perf_counter()
        req = LineRequest(npc, state, persona, intent, context, seed, max_tokens, temperature=temperature,
                          top_p=top_p, deadline_ms=deadline_ms, **more)
        return self._serve(self._prepare(req, t0))

    def generate_request(self, request: LineRequest) -> Line:
        """:meth:`generate` for a :class:`LineRequest`."""
        return self._serve(self._prepare(request, time.perf_counter()))

    def generate_stream(self, npc: str, state: str, **kwargs: Any) -> LineStream:
        """Like :meth:`generate`, but an iterator of text pieces as tokens decode.

        The pieces concatenate to the returned line's text (``stream.line`` once exhausted).
        Pieces are held back while the line could still turn out to be a repeat or have no
        words, so a line that is resampled or replaced by a fallback is never half shown, and a
        word shows once it is complete; a deadline that expires (or a dead end of the word
        constraints that comes) after text was shown ends the line there instead of replacing it.
        """
        t0 = time.perf_counter()
        return LineStream(self, self._prepare(LineRequest(npc, state, **kwargs), t0))

    def generate_batch(self, requests: Sequence[LineRequest | Mapping[str, Any]], *,
                       max_batch: int = 32) -> list[Line]:
        """Lines for many requests, decoded together (up to ``max_batch`` rows per batch).

        Prompts of different lengths are left-padded and masked, so any requests can share a
        batch. Requests with ``batch=False`` run alone. Results are in request order.
        """
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        t0 = time.perf_counter()
        reqs = [r if isinstance(r, LineRequest) else LineRequest(**r) for r in requests]
        preps = [self._prepare(r, t0) for r in reqs]
        out: list[Line | None] = [None] * len(preps)
        batched: list[int] = []
        for i, p in enumerate(preps):
            if not (p.req.batch and self.model is not None and not self._expired(p)):
                out[i] = self._serve(p)  # plays back, decodes or falls back on its own
            elif (played := self._played(p)) is not None:
                out[i] = played
            else:
                batched.append(i)
        # similar lengths together keeps the padding small
        batched.sort(key=lambda i: (len(preps[i].ids), preps[i].prefix_len))
        for start in range(0, len(batched), max_batch):
            chunk = batched[start: start + max_batch]
            if len(chunk) == 1:
                out[chunk[0]] = self._serve(preps[chunk[0]])
                continue
            for i, line in zip(chunk, self._serve_group([preps[i] for i in chunk])):
                out[i] = line
        return [line for line in out if line is not None]

    def submit(self, npc: str, state: str, **kwargs: Any) -> Future[Line]:
        """Queue a request for a worker thread; returns at once with a Future of the Line.

        The deadline (``deadline_ms``) counts from this call. Invalid requests raise here.
        Call :meth:`poll` once per frame: it returns finished lines and answers any request whose
        deadline has passed with a fallback line, so a frame never waits on the model.
        """
        prep = self._prepare(LineRequest(npc, state, **kwargs), time.perf_counter())
        return self._enqueue(prep, polled=True)

    async def agenerate(self, npc: str, state: str, **kwargs: Any) -> Line:
        """:meth:`generate` for asyncio: ``line = await gen.agenerate("guard", "alert", ...)``.

        The request runs on the worker threads :meth:`submit` uses (``workers`` of them), so the
        event loop stays free and many coroutines may await lines at once. Invalid requests
        raise ValueError here. Cancelling the awaiting task cancels the request: the model stops
        decoding it at its next token and nothing is recorded. A ``deadline_ms`` (counted from
        this call) that passes while the request waits for a worker or decodes is answered at
        once with a fallback line, as :meth:`poll` does for :meth:`submit`.
        """
        import asyncio  # here: a game that never awaits a line does not pay asyncio's import

        loop = asyncio.get_running_loop()
        prep = self._prepare(LineRequest(npc, state, **kwargs), time.perf_counter())
        fut = self._enqueue(prep, polled=False)
        timer = None
        if prep.deadline is not None:
            timer = loop.call_later(max(0.0, prep.deadline - time.perf_counter()), self._expire, fut, prep)
        try:
            return await asyncio.wrap_future(fut)  # cancelling this cancels ``fut``
        finally:
            if timer is not None:
                timer.cancel()

    def astream(self, npc: str, state: str, **kwargs: Any) -> AsyncLineStream:
        """:meth:`generate_stream` for asyncio: ``async for piece in gen.astream(...)``.

        The same pieces as :meth:`generate_stream` (held back until they can no longer be
        taken back), decoded on a worker thread and handed to the loop as they come;
        ``stream.line`` holds the :class:`Line` once the iteration ends. Invalid requests raise
        ValueError here. Leaving the loop early, or cancelling the task iterating it, cancels
        the request: the model stops decoding at its next token. An error inside the engine
        that is not the model's (those become fallback lines) is raised in the iterating task.
        """
        return AsyncLineStream(self, self._prepare(LineRequest(npc, state, **kwargs), time.perf_counter()))

    def poll(self) -> list[tuple[Future[Line], Line]]:
        """(future, line) for every submitted request finished since the last poll; requests past
        their deadline are finished now with a fallback line. Never blocks on the model."""
        now = time.perf_counter()
        with self._async_lock:
            late = [(f, p) for f, p in self._pending.items() if p.deadline is not None and now >= p.deadline]
        for fut, prep in late:
            self._complete(fut, self._fallback(prep, "deadline"))
        out = []
        with self._async_lock:
            while self._done:
                fut = self._done.popleft()
                if not fut.cancelled():  # cancelled by its caller: nobody waits for the line
                    out.append((fut, fut.result()))
        return out

    def close(self) -> None:
        """Stop the worker threads and the mask threads (pending requests are answered with
        fallback lines; a line decoding meanwhile makes its masks on its own thread)."""
        with self._async_lock:
            executor, self._executor = self._executor, None
            masks, self._mask_pool = self._mask_pool, None
            pending = list(self._pending.items())
        for fut, prep in pending:
            self._complete(fut, self._fallback(prep, "cancelled"))
        for pool in (executor, masks):
            if pool is not None:
                pool.shutdown(wait=True)

    def __enter__(self) -> LineGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def warm_prefixes(self, requests: Iterable[LineRequest | Mapping[str, Any]]) -> int:
        """Compute and cache the prefix keys/values of ``requests`` ahead of time; returns how many
        were computed (the others were cached already)."""
        n = 0
        if self.model is None:
            return 0
        for r in requests:
            prep = self._prepare(r if isinstance(r, LineRequest) else LineRequest(**r), time.perf_counter())
            prefix = prep.ids[: prep.prefix_len]
            if self.prefix_cache.get(prefix, prep.req.domain) is None:
                self.prefix_cache.put(prefix, self.model.step(np.asarray([prefix]), None)[1], prep.req.domain)
                n += 1
        return n

    def prefix_logits(self, npc: str, state: str, *, cached: bool, **kwargs: Any) -> np.ndarray:
        """The logits of the request's first line token, computed on the cached prefix
        (``cached=True``, computing and caching it on a miss) or from scratch; for tests and tools."""
        if self.model is None:
            raise RuntimeError("no model loaded (fallback-only mode)")
        prep = self._prepare(LineRequest(npc, state, **kwargs), time.perf_counter())
        logits, _, _, _, _ = self._prefill([prep], use_cache=cached)
        return logits[0, -1].copy()

    def stats(self) -> dict[str, Any]:
        """Counters and recent latency percentiles (ms) of this generator."""
        with self._stats_lock:
            lat, ttft = list(self._latencies), list(self._ttfts)
            counts, reasons = dict(self._counts), dict(self._reasons)
        cs = self.prefix_cache.stats
        return {
            **counts,
            "fallback_reasons": reasons,
            "latency_ms_p50": _percentile(lat, 50),
            "latency_ms_p99": _percentile(lat, 99),
            "ttft_ms_p50": _percentile(ttft, 50),
            "prefix_cache": {"queries_tokens": cs.queries_tokens, "hits_tokens": cs.hits_tokens,
                             "hit_rate": cs.hit_rate, "entries": cs.entries, "bytes": cs.bytes,
                             "l1_hits": cs.l1_hits, "l2_hits": cs.l2_hits, "misses": cs.misses,
                             "evictions": cs.evictions, "expired": cs.expired},
            "active_params_pct": self.active_params_pct,
            "model_loaded": self.model is not None,
            "load_ms": self.load_ms,
        }

    # ------------------------------------------------------------ requests

    def _prepare(self, req: LineRequest, t0: float) -> _Prepared:
        cat = self._catalog
        if not isinstance(req.npc, str):
            raise ValueError(f"npc must be an archetype name, got {req.npc!r}")
        temperature = self.temperature if req.temperature is None else req.temperature
        top_p = self.top_p if req.top_p is None else req.top_p
        top_k = self.top_k if req.top_k is None else req.top_k
        check_sampling(temperature, top_k, top_p, req.max_tokens, req.min_tokens)
        if req.deadline_ms is not None and not (isinstance(req.deadline_ms, (int, float)) and req.deadline_ms >= 0):
            raise ValueError(f"deadline_ms must be a number >= 0 or None, got {req.deadline_ms!r}")
        closed: dict[str, str] = {}
        slot_values = dict(self.slot_defaults)
        for key, value in (req.context or {}).items():
            if key in cat["slots"]:
                if not isinstance(value, str):
                    raise ValueError(f"slot value for {key!r} must be a string, got {value!r}")
                slot_values[key] = value
            elif key in cat["context"]:
                closed[key] = value
            else:
                raise ValueError(f"unknown context key {key!r}; known: context slots {list(cat['context'])}, "
                                 f"free-text slots {list(cat['slots'])}")
        persona = () if req.persona is None else req.persona
        if self.model is not None:
            ids, prefix_len = self.tokenizer.encode_prompt(req.npc, persona, req.state, req.intent, closed)
        else:
            check_request(cat, req.npc, persona, req.state, req.intent, closed)
            ids, prefix_len = [], 0
        allowed = set(cat["slots"])
        if self.slot_rules is not None:
            allowed &= self.slot_rules.allowed(req.npc, req.state, req.intent)
        blocked_slots = [s for s in cat["slots"] if s not in allowed or s not in slot_values]
        slot_block = (np.asarray([self._slot_ids[s] for s in blocked_slots], dtype=np.int64)
                      if self.model is not None and blocked_slots else None)
        banned = self.mask.banned_bits(req.npc, persona, closed) if self.model is not None else None
        if req.seed is None:
            with self._seed_lock:
                seed = int(self._seed_rng.integers(2**31))
        else:
            seed = int(req.seed)
        deadline = None if req.deadline_ms is None else t0 + req.deadline_ms / 1e3
        return _Prepared(req, ids, prefix_len, slot_values, slot_block, banned, float(temperature), float(top_p),
                         int(top_k), seed, t0, deadline)

    @staticmethod
    def _expired(prep: _Prepared) -> bool:
        return prep.deadline is not None and time.perf_counter() >= prep.deadline

    def _new_row(self, prep: _Prepared, seed: int | list[int]) -> _Row:
        assert self.model is not None
        room = self.model.block_size - len(prep.ids)
        return _Row(prep, np.random.default_rng(seed), max(0, min(prep.req.max_tokens, room)))

    def _resumed_row(self, prev: _Row, keep: int, seed: int | list[int]) -> _Row:
        """A row that goes on from the first ``keep`` tokens of ``prev`` (their keys and values
        computed again in the prefill, on top of the cached prefix), with a new ``seed``."""
        prep = replace(prev.prep, ids=[*prev.prep.ids, *prev.tokens[:keep]])
        return _Row(prep, np.random.default_rng(seed), prev.budget, tokens=prev.tokens[:keep],
                    state=prev.states[keep - 1], states=prev.states[:keep], router=prev.router[:keep],
                    scored=prev.scored[:keep], ttft=prev.ttft)

    def _serve(self, prep: _Prepared, cancelled: Callable[[], bool] | None = None,
               first: _Row | None = None) -> Line:
        """The line for one request: model lines (resampled on repeats), else a fallback."""
        for event in self._attempts(prep, cancelled, first=first):
            if isinstance(event, Line):
                return event
        raise AssertionError("unreachable: _attempts always ends with a Line")

    def _serve_group(self, preps: list[_Prepared]) -> list[Line]:
        assert self.model is not None
        rows = [self._new_row(p, p.seed) for p in preps]
        room = self.model.block_size - self._padded_length(preps, self.use_prefix_cache)
        for r in rows:
            r.budget = max(0, min(r.budget, room))
        try:
            for _ in self._decode(rows):
                pass
        except Exception:
            log.exception("model error in a batch of %d", len(rows))
            return [self._fallback(p, "model_error", r) for p, r in zip(preps, rows)]
        return [self._serve(p, first=r) for p, r in zip(preps, rows)]

    def _attempts(self, prep: _Prepared, cancelled: Callable[[], bool] | None = None, *,
                  first: _Row | None = None, stream: bool = False) -> Generator[str | Line, None, None]:
        """Decode attempts for one request; yields text pieces (``stream=True``) and then the Line."""
        played = self._played(prep) if first is None else None
        if played is not None:
            if stream:
                yield played.text
            yield played
            return
        if self.model is None:
            yield from self._yield_fallback(prep, "model_unavailable", None, stream)
            return
        if first is None and self._expired(prep):
            yield from self._yield_fallback(prep, "deadline", None, stream)
            return
        reason = "unusable"
        row = first
        why: str | None = None
        gate = _StreamGate(self, prep) if stream else None
        for attempt in range(self.max_resamples + 1):
            if not (first is not None and attempt == 0):
                seed = prep.seed if attempt == 0 else [prep.seed, attempt]
                # a sample the constraints stopped is drawn again from its last sentence end
                # (a trigram stop: the last one before the trigram), a stream from no earlier
                # than what it has shown
                keep = 0
                if row is not None and why == "blocked":
                    keep = restart_point(row.states if row.redraw_at is None else row.states[:row.redraw_at])
                    if gate is not None and gate.shown:
                        keep = max(keep, tokens_through(self.tokenizer, row.tokens, gate.shown_upto))
                row = self._resumed_row(row, keep, seed) if row is not None and keep else self._new_row(prep, seed)
                try:
                    for _tok in self._decode([row], cancelled=cancelled):
                        if gate is not None:
                            piece = gate.piece(row)
                            if piece:
                                yield piece
                except Exception:  # the game must get a line whatever the model does
                    log.exception("model error while generating for %s/%s", prep.req.npc, prep.req.state)
                    yield from self._yield_fallback(prep, "model_error", row, stream)
                    return
            assert row is not None
            shown = gate.shown if gate is not None else ""
            if row.finish == "cancelled" and not shown:
                yield self._abandoned(prep, row)
                return
            if row.finish == "deadline" and not shown:
                yield from self._yield_fallback(prep, "deadline", row, stream)
                return
            if shown and row.finish == "blocked" and attempt < self.max_resamples:
                line, why = None, "blocked"  # a stream goes on from what it has shown, with another sample
            else:
                if gate is not None and shown and 0 <= row.cut < gate.shown_upto:
                    row.cut = gate.shown_upto  # a cut inside what was shown: it stays said
                line, why = self._finish(row, attempt + 1, shown=bool(shown))
            if line is not None:
                if stream and line.text[len(shown):]:
                    yield line.text[len(shown):]
                yield line
                return
            reason = "unusable" if why == "blocked" else why or reason
            if why not in ("repeat", "blocked"):  # only these depend on the sample drawn
                break
            with self._stats_lock:
                self._counts["resamples"] += 1
        yield from self._yield_fallback(prep, reason, row, stream, attempts=attempt + 1)

    def _played(self, prep: _Prepared) -> Line | None:
        """One of the studio's authored lines (:mod:`runtime.client.authored`), or None: then the
        model writes.

        * The request's cell is covered: :meth:`AuthoredBook.choose`, finish reason ``authored``.
        * Else, with a model loaded, the archetype's lines for the same move in the near states
          (:meth:`AuthoredBook.near`), the model choosing by state fit
          (:func:`runtime.client.line_fit.state_fit`, :meth:`AuthoredBook.choose_fitting`),
          finish reason ``authored_near``.

        Either way only lines this NPC has not said to this player recently and that say no
        phrase the request's tags rule out (night called daylight)."""
        if self.authored is None:
            return None
        req = prep.req
        closed = {k: v for k, v in (req.context or {}).items() if k in self._catalog["context"]}
        persona = tuple(req.persona or ())
        rng = np.random.default_rng([prep.seed, 104729])

        def usable(ln: Any) -> bool:
            return not self.memory.said_recently(prep.memory_key, ln.text) and (
                prep.banned is None or not self.mask.says_banned(ln.text, prep.banned))

        ask = (req.npc, req.state, req.intent, persona, closed)
        own = self.authored.choose(*ask, slots=prep.slot_values, rng=rng, usable=usable)
        if own is not None:
            return self._authored_line(prep, own.text, "authored")
        if self.model is None:
            return None
        near = self.authored.near(*ask, slots=prep.slot_values, usable=usable)
        if not near:
            return None
        tok = self.tokenizer
        prompts = [tok.encode_prompt(req.npc, persona, ln.state, req.intent, closed)[0] for ln in near]
        fit = state_fit(self.model, self._fit_cache, prep.ids, prompts,
                        [[*tok.encode(ln.text), tok.eos_id] for ln in near])
        return self._authored_line(prep, AuthoredBook.choose_fitting(near, fit, rng).text, "authored_near")

    def _authored_line(self, prep: _Prepared, raw: str, reason: str) -> Line:
        self.memory.remember(prep.memory_key, raw)
        line = Line(fill_slots(raw, prep.slot_values), (), self._ms(prep.t0), None, False, False,
                    self.active_params_pct, None, None, reason, raw, prep.seed, 0)
        self._record(line)
        return line

    def _yield_fallback(self, prep: _Prepared, reason: str, row: _Row | None,
                        stream: bool, attempts: int | None = None) -> Iterator[str | Line]:
        line = self._fallback(prep, reason, row, attempts)
        if stream:
            yield line.text
        yield line

    def _row_raw(self, row: _Row) -> str:
        text = self._text(row)
        return text[: row.cut] if row.cut >= 0 else text

    def _finish(self, row: _Row, attempts: int, *, shown: bool = False) -> tuple[Line | None, str | None]:
        """A model Line for a decoded row, or (None, why it cannot be used). ``shown``: text of it
        was already streamed, so it is kept whatever it is."""
        prep = row.prep
        raw = without_broken_bytes(self._row_raw(row)).strip()
        mean_lp = _mean_logprob(row.scored, row.tokens)
        if not shown:
            if row.finish == "blocked":
                return None, "blocked"  # cut short at a dead end: another sample, else a fallback
            if usable(raw) is not None:
                return None, "unusable"
            if self.min_mean_logprob is not None and mean_lp is not None and mean_lp < self.min_mean_logprob:
                return None, "unusable"  # the model was guessing: gibberish, not a line
            if self.memory.said_recently(prep.memory_key, raw):
                return None, "repeat"
        self.memory.remember(prep.memory_key, raw)
        conf = _router_confidence(row.router)
        line = Line(fill_slots(raw, prep.slot_values), tuple(row.tokens), self._ms(prep.t0),
                    None if row.ttft is None else (row.ttft - prep.t0) * 1e3, row.hit, False,
                    self.active_params_pct, conf, None, row.finish or "length", raw, prep.seed, attempts,
                    mean_lp)
        self._record(line)
        return line, None

    def _abandoned(self, prep: _Prepared, row: _Row) -> Line:
        """The result of a request that was answered elsewhere meanwhile (by :meth:`poll` or
        :meth:`close`): never delivered, so it touches neither the fallback rotation nor metrics."""
        return Line("", tuple(row.tokens), self._ms(prep.t0), None, row.hit, True, self.active_params_pct, None,
                    "cancelled", "fallback", "", prep.seed, 1)

    def _fallback(self, prep: _Prepared, reason: str, row: _Row | None = None, attempts: int | None = None) -> Line:
        """An authored line for the request (its archetype, state and intent:
        :meth:`FallbackBook.pick`), recorded in the metrics."""
        rng = np.random.default_rng([prep.seed, 7919])
        text = self.fallbacks.pick(prep.req.npc, prep.req.state, prep.memory_key, rng, intent=prep.req.intent)
        line = Line(text, (), self._ms(prep.t0),
                    None if row is None or row.ttft is None else (row.ttft - prep.t0) * 1e3,
                    bool(row is not None and row.hit), True, self.active_params_pct, None, reason,
                    "fallback", text, prep.seed, (0 if row is None else 1) if attempts is None else attempts)
        self._record(line, tokens=0 if row is None else len(row.tokens))
        return line

    @staticmethod
    def _ms(t0: float) -> float:
        return (time.perf_counter() - t0) * 1e3

    def _record(self, line: Line, tokens: int | None = None) -> None:
        n = len(line.tokens) if tokens is None else tokens
        self.metrics.line(fallback=line.fallback, reason=line.fallback_reason, latency_s=line.latency_ms / 1e3,
                          ttft_s=None if line.ttft_ms is None else line.ttft_ms / 1e3, tokens=n,
                          router_confidence=line.router_confidence)
        with self._stats_lock:
            self._counts["lines"] += 1
            self._counts["fallback_lines" if line.fallback
                         else "authored_lines" if line.finish_reason.startswith("authored") else "model_lines"] += 1
            self._counts["tokens"] += n
            if line.fallback_reason:
                self._reasons[line.fallback_reason] = self._reasons.get(line.fallback_reason, 0) + 1
            self._latencies.append(line.latency_ms)
            if line.ttft_ms is not None:
                self._ttfts.append(line.ttft_ms)

    # ------------------------------------------------------------ async

    def _workers(self) -> ThreadPoolExecutor:
        """The worker threads of :meth:`submit`, :meth:`agenerate` and :meth:`astream` (started on
        first use; call with ``_async_lock`` held)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix=f"flashnpc-{self.name}")
        return self._executor

    def _masks(self) -> ThreadPoolExecutor:
        """The pipelined masks' threads (``workers + 1``: a game thread's lines and the workers'
        at once), started on first use; shut down by :meth:`close` or with the generator."""
        with self._async_lock:
            if self._mask_pool is None:
                pool = ThreadPoolExecutor(self.workers + 1, thread_name_prefix=f"flashnpc-{self.name}-masks")
                weakref.finalize(self, pool.shutdown, wait=False)
                self._mask_pool = pool
            return self._mask_pool

    def _enqueue(self, prep: _Prepared, *, polled: bool) -> Future[Line]:
        """Queue ``prep`` for a worker; a ``polled`` request's line is also handed out by :meth:`poll`."""
        fut: Future[Line] = Future()
        with self._async_lock:
            executor = self._workers()
            self._pending[fut] = prep
            fut.add_done_callback(self._on_done if polled else self._forget)
            executor.submit(self._run_async, prep, fut)
        return fut

    def _expire(self, fut: Future[Line], prep: _Prepared) -> None:
        """Answer ``fut`` with a deadline fallback unless it is answered already."""
        if not fut.done():
            self._complete(fut, self._fallback(prep, "deadline"))

    def _run_async(self, prep: _Prepared, fut: Future[Line]) -> None:
        if fut.done():
            return
        try:
            line = self._serve(prep, cancelled=fut.done)
        except Exception as exc:  # _serve already turns model errors into fallbacks: a bug
            log.exception("unexpected error in a worker")
            try:
                line = self._fallback(prep, "model_error")
            except Exception:  # not even a fallback: the caller hears the error, never silence
                with contextlib.suppress(InvalidStateError):
                    fut.set_exception(exc)
                return
        self._complete(fut, line)

    def _stream_async(self, prep: _Prepared, cancelled: Callable[[], bool],
                      put: Callable[[str | Line | BaseException | None], None]) -> None:
        """Decode ``prep`` as a stream on a worker: every piece, then the Line, then None, go to
        ``put`` (an error raised instead of a Line goes there too, then None)."""

        def work() -> None:
            try:
                for event in self._attempts(prep, cancelled, stream=True):
                    put(event)
            except Exception as exc:
                put(exc)
            finally:
                put(None)

        with self._async_lock:
            self._workers().submit(work)

    def _complete(self, fut: Future[Line], line: Line) -> None:
        with contextlib.suppress(InvalidStateError):  # answered already (by poll or close)
            fut.set_result(line)

    def _on_done(self, fut: Future[Line]) -> None:
        with self._async_lock:
            if self._pending.pop(fut, None) is not None:
                self._done.append(fut)

    def _forget(self, fut: Future[Line]) -> None:
        with self._async_lock:
            self._pending.pop(fut, None)

    # ------------------------------------------------------------ decoding

    @staticmethod
    def _padded_length(preps: Sequence[_Prepared], use_cache: bool) -> int:
        """Length of the batch's prompt block once rows are left-padded to a common shape."""
        if not use_cache:
            return max(len(p.ids) for p in preps)
        return max(p.prefix_len for p in preps) + max(len(p.ids) - p.prefix_len for p in preps)

    def _prefill(self, preps: Sequence[_Prepared], *, use_cache: bool
                 ) -> tuple[np.ndarray, KV, np.ndarray, list[bool], np.ndarray | None]:
        """Run the prompts up to their first line token.

        Returns (logits [B, T, V], past, router_probs, prefix cache hit per row, attention mask).
        Rows of different shapes are left-padded (the prefix keys/values to the longest prefix,
        the suffix to the longest suffix) and masked; the mask is None when nothing is padded.
        """
        model = self.model
        assert model is not None
        b = len(preps)
        lens = [len(p.ids) for p in preps]
        plens = [p.prefix_len for p in preps]
        if not use_cache or not all(0 < pl < n for pl, n in zip(plens, lens)):
            if len(set(lens)) == 1:
                logits, past, router = model.step(np.asarray([p.ids for p in preps], dtype=np.int64), None)
                return logits, past, router, [False] * b, None
            t = max(lens)
            ids = np.full((b, t), self.tokenizer.pad_id, dtype=np.int64)
            mask = np.zeros((b, t), dtype=np.int64)
            pos = np.zeros((b, t), dtype=np.int64)
            for i, p in enumerate(preps):
                n = len(p.ids)
                ids[i, t - n:], mask[i, t - n:], pos[i, t - n:] = p.ids, 1, np.arange(n)
            logits, past, router = model.step(ids, None, attention_mask=mask, position_ids=pos)
            return logits, past, router, [False] * b, mask
        kvs, hits = [], []
        for p in preps:
            prefix = p.ids[: p.prefix_len]
            kv = self.prefix_cache.get(prefix, p.req.domain)
            hit = kv is not None
            if kv is None:
                kv = self.prefix_cache.put(prefix, model.step(np.asarray([prefix]), None)[1], p.req.domain)
            self.metrics.prefix_query(p.prefix_len, hit)
            kvs.append(kv)
            hits.append(hit)
        if len(set(lens)) == 1 and len(set(plens)) == 1:
            past = kvs[0] if b == 1 else [np.concatenate([kv[j] for kv in kvs]) for j in range(len(kvs[0]))]
            ids = np.asarray([p.ids[p.prefix_len:] for p in preps], dtype=np.int64)
            logits, present, router = model.step(ids, past)
            return logits, present, router, hits, None
        big_p, big_s = max(plens), max(n - pl for n, pl in zip(lens, plens))
        past = []
        for j in range(len(kvs[0])):
            _, h, _, d = kvs[0][j].shape
            layer = np.zeros((b, h, big_p, d), dtype=np.float32)
            for i, kv in enumerate(kvs):
                layer[i, :, big_p - plens[i]:] = kv[j][0]
            past.append(layer)
        ids = np.full((b, big_s), self.tokenizer.pad_id, dtype=np.int64)
        mask = np.zeros((b, big_p + big_s), dtype=np.int64)
        pos = np.zeros((b, big_s), dtype=np.int64)
        for i, p in enumerate(preps):
            s_len = lens[i] - plens[i]
            ids[i, big_s - s_len:] = p.ids[p.prefix_len:]
            mask[i, big_p - plens[i]: big_p] = 1
            mask[i, big_p + big_s - s_len:] = 1
            pos[i, big_s - s_len:] = np.arange(plens[i], lens[i])
        logits, present, router = model.step(ids, past, attention_mask=mask, position_ids=pos)
        return logits, present, router, hits, mask

    def _decode(self, rows: list[_Row], *, use_cache: bool | None = None,
                cancelled: Callable[[], bool] | None = None) -> Generator[int, None, None]:
        """Decode ``rows`` in lock step; yields each token of a one-row decode.

        Every row stops at ``eos`` (not before ``min_tokens``), at its budget, a stop string, its
        deadline or ``cancelled()``; ``row.finish`` says which. Finished rows leave the batch.
        """
        assert self.model is not None
        use_cache = self.use_prefix_cache if use_cache is None else use_cache
        logits, past, router, hits, mask = self._prefill([r.prep for r in rows], use_cache=use_cache)
        eos = self.tokenizer.eos_id
        t_in = logits.shape[1]
        next_pos = np.asarray([len(r.prep.ids) for r in rows], dtype=np.int64)
        for b, r in enumerate(rows):
            r.hit = hits[b]
            r.router.append(router[:, b * t_in + t_in - 1])
            if r.budget == 0:
                r.finish = "length"
        t_step = [time.perf_counter()]
        single = len(rows) == 1
        pool = self._masks() if self.pipelined else None

        def advance(r: _Row) -> None:
            r.state = self.mask.step(r.state, r.tokens[-1])
            r.states.append(r.state)

        def ahead(live: list[int]) -> None:
            """The rows' states after the tokens fed, and their next positions' masks."""
            for b in live:
                r = rows[b]
                advance(r)
                r.parts = self.mask.prepare(r.state, last=len(r.tokens) + 1 >= r.budget, banned=r.prep.banned)

        def overlap(live: list[int]) -> Future[None]:
            """:func:`ahead` on a mask thread while the model runs (pipelined)."""
            assert pool is not None
            try:
                return pool.submit(ahead, live)
            except RuntimeError:  # the pool was shut down (close) during the line: made here
                done: Future[None] = Future()
                ahead(live)
                done.set_result(None)
                return done

        def pick(b: int, row_logits: np.ndarray) -> tuple[int | None, bool]:
            r = rows[b]
            if r.finish is not None:
                return None, False
            if cancelled is not None and cancelled():
                r.finish = "cancelled"
                return None, False
            # a row whose deadline would pass during the next step stops now, so its fallback is on time
            if r.prep.deadline is not None and time.perf_counter() + self._step_s >= r.prep.deadline:
                r.finish = "deadline"
                return None, False
            tok = self._sample(r, row_logits, eos)
            if tok is None and (r.state.mode or r.vetoed):
                # a dead end inside a word, or a veto: the line ends at its last complete word;
                # at the budget's last token that is where it ends anyway (length), else the
                # sample is drawn again (blocked)
                last = len(r.tokens) + 1 >= r.budget
                r.finish, r.cut = "length" if last else "blocked", len(settled_text(self._text(r)))
                return None, False
            if tok is None or tok == eos:
                r.finish = "eos"
                if not (self.trigrams is not None and self._trigram_stop(r, final=True)):
                    self._repeat_stop(r, final=True)
                return None, False
            r.tokens.append(tok)
            r.scored.append(row_logits)
            if pool is None:
                advance(r)
            if (self.trigrams is not None and self._trigram_stop(r, final=False)) or self._repeat_stop(r):
                if pool is not None:
                    advance(r)
                return None, False
            if r.prep.req.stop:
                cut = stop_index(self._text(r), r.prep.req.stop)
                if cut >= 0:
                    r.cut, r.finish = cut, "stop"
            if r.finish is None and len(r.tokens) >= r.budget:
                r.finish = "length"
            if pool is not None and r.finish is not None:
                advance(r)  # (a row that goes on is advanced while the model runs: ahead)
            return tok, r.finish is None

        def on_step(live: list[int], router: np.ndarray) -> None:
            now = time.perf_counter()
            dt = now - t_step[0]
            self._step_s = 0.9 * self._step_s + 0.1 * dt if self._step_s else dt
            t_step[0] = now
            for i, b in enumerate(live):
                rows[b].router.append(router[:, i])

        for _b, tok in decode_rows(self.model, logits, past, len(rows), pick, attention_mask=mask,
                                   next_pos=None if mask is None else next_pos, on_step=on_step,
                                   overlap=None if pool is None else overlap):
            if single:
                yield tok

    def _trigram_stop(self, r: _Row, *, final: bool) -> bool:
        """Stop ``r`` as ``blocked`` if its text now holds a trigram :attr:`trigrams` lacks: its
        complete words (``final``: all of it, the line's end included) its reader has not read."""
        assert self.trigrams is not None
        text = self._text(r)
        if not final:
            text = settled_text(text)
            if len(text) <= r.reader.read:
                return False
        hit = self.trigrams.first_unseen(text, reader=r.reader, final=final)
        if hit is None:
            return False
        _tri, cut, end = hit
        self._block(r, cut, end)
        return True

    def _repeat_stop(self, r: _Row, *, final: bool = False) -> bool:
        """Stop ``r`` as ``blocked`` if the sentence its last token ended (``final``: any
        sentence of the finished line, as the evaluation reads it) says an earlier one of it
        again (:func:`runtime.client.repeats.repeated_sentence`): drawn again from the sentence
        before the repeat, the line cut there if every draw repeats."""
        text = self._text(r)
        if not final and not text.endswith(ENDS_A_SENTENCE):
            return False
        hit = repeated_sentence(text)
        if hit is None:
            return False
        # through the repeat's first token, so the restart point is the sentence end before it
        self._block(r, hit[0], hit[0] + 1)
        return True

    def _block(self, r: _Row, cut: int, end: int) -> None:
        """Stop ``r`` as ``blocked``: the line is ``text[:cut]`` if it ends here, and another
        sample goes on from the last sentence end in the tokens that reach offset ``end``."""
        r.finish, r.cut = "blocked", cut
        r.redraw_at = tokens_through(self.tokenizer, r.tokens, end)

    def _text(self, r: _Row) -> str:
        """``r``'s decoded text, decoding only the tokens added since the last call (all of them
        again where a piece is not whole UTF-8 on its own)."""
        if r.text_n < len(r.tokens):
            piece = self.tokenizer.decode(r.tokens[r.text_n:])
            if "\ufffd" in piece or "\ufffd" in r.text:
                r.text = self.tokenizer.decode(r.tokens)
            else:
                r.text += piece
            r.text_n = len(r.tokens)
        return r.text

    def _sample(self, r: _Row, logits: np.ndarray, eos: int) -> int | None:
        """Sample the next token of ``r`` with its masks applied (None if every token is blocked)."""
        n = len(r.tokens)
        row, veto = self.mask.masked_row(logits, r.state, last=n + 1 >= r.budget, banned=r.prep.banned,
                                         block=r.prep.slot_block, parts=r.parts)
        r.parts = None
        # judged before min_tokens holds eos back: a line asked to go on is not derailing
        if veto:
            r.vetoed = True
            return None
        if n < r.prep.req.min_tokens:
            row[eos] = -np.inf
        if not np.isfinite(row).any():
            return None
        tok = sample_next(row, r.rng, temperature=r.prep.temperature, top_k=r.prep.top_k, top_p=r.prep.top_p)
        if r.ttft is None:
            r.ttft = time.perf_counter()
        return tok


def _router_confidence(routers: list[np.ndarray]) -> float | None:
    """Mean over tokens and MoE layers of the top-1 router probability (each item [n_moe, n_expert])."""
    if not routers:
        return None
    stacked = np.stack(routers)
    return float(stacked.max(-1).mean()) if stacked.size else 1.0


def _mean_logprob(scored: list[np.ndarray], tokens: list[int]) -> float | None:
    """Mean log-probability (temperature 1, unmasked) of ``tokens`` under the logits they were drawn from."""
    if not tokens:
        return None
    logits = np.stack(scored).astype(np.float64)
    top = logits.max(-1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(logits - top).sum(-1))
    return float((logits[np.arange(len(tokens)), tokens] - lse).mean())


class _StreamGate:
    """Decides how much of a line being decoded may be shown yet (see generate_stream)."""

    def __init__(self, gen: LineGenerator, prep: _Prepared) -> None:
        self.gen = gen
        self.prep = prep
        self.shown = ""
        self.shown_upto = 0  # how far into the row's decoded text ``shown`` reaches
        self.recent = gen.memory.recent(prep.memory_key)
        self.hold = max((len(s) for s in prep.req.stop), default=1) - 1

    def piece(self, row: _Row) -> str:
        raw = self.gen._row_raw(row)
        if row.cut < 0 and self.hold:
            raw = raw[: max(0, len(raw) - self.hold)]
        if row.finish is None:  # a word still being spelled shows once it is complete
            raw = settled_text(raw)
        upto = len(raw)
        raw = without_broken_bytes(raw.rstrip("\ufffd")).strip()
        if not self.shown:
            if usable(raw) is not None:
                return ""
            norm = normalise_line(raw)
            if any(r.startswith(norm) for r in self.recent):
                return ""
        text = fill_slots(raw, self.prep.slot_values)
        if len(text) <= len(self.shown):
            return ""
        piece, self.shown, self.shown_upto = text[len(self.shown):], text, upto
        return piece


class LineStream:
    """Iterator of text pieces of one line; ``line`` holds the :class:`Line` once exhausted."""

    def __init__(self, gen: LineGenerator, prep: _Prepared) -> None:
        self._gen = gen
        self._prep = prep
        self.line: Line | None = None

    def __iter__(self) -> Iterator[str]:
        for event in self._gen._attempts(self._prep, stream=True):
            if isinstance(event, Line):
                self.line = event
            elif event:
                yield event


class AsyncLineStream:
    """Async iterator of text pieces of one line (:meth:`LineGenerator.astream`); ``line`` holds
    the :class:`Line` once the iteration ends. It may be iterated once."""

    def __init__(self, gen: LineGenerator, prep: _Prepared) -> None:
        self._gen = gen
        self._prep = prep
        self._cancel = threading.Event()
        self._started = False
        self.line: Line | None = None

    def __aiter__(self) -> AsyncIterator[str]:
        if self._started:
            raise RuntimeError("an AsyncLineStream can be iterated once")
        self._started = True
        return self._pieces()

    def cancel(self) -> None:
        """Stop decoding (the iteration then ends; also what leaving it early does)."""
        self._cancel.set()

    async def _pieces(self) -> AsyncIterator[str]:
        import asyncio

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | Line | BaseException | None] = asyncio.Queue()

        def put(event: str | Line | BaseException | None) -> None:  # on the worker thread
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody listens
                loop.call_soon_threadsafe(queue.put_nowait, event)

        self._gen._stream_async(self._prep, self._cancel.is_set, put)
        try:
            while (event := await queue.get()) is not None:
                if isinstance(event, BaseException):
                    raise event
                if isinstance(event, Line):
                    self.line = event
                elif event:
                    yield event
        finally:
            self._cancel.set()  # left early or cancelled: the worker stops at its next token


# --------------------------------------------------------------------------- loading helpers


def _resolve_bundle(root: Path, file: str, public_key: PublicKey | None) -> tuple[Path, str, bool]:
    """A mobile bundle (directory with ``manifest.json``, or its zip) becomes its verified
    (extracted) directory and the model file its manifest names, and True; a model directory
    is unchanged (False). A bundle that fails a check raises :class:`BundleError`."""
    from runtime.client.bundle import is_bundle, resolve_model_path

    if not root.exists():
        raise ModelLoadError(f"{root}: no such model directory or bundle")
    resolved, name = resolve_model_path(root, file, public_key=public_key)
    return resolved, name, is_bundle(root)


def _release(root: Path) -> None:
    from runtime.client.bundle import discard_extraction

    discard_extraction(root)


def _load_model(root: Path, file: str, threads: int) -> FlashOnnx:
    import json

    if not root.is_dir():
        raise ModelLoadError(f"{root}: no such model directory")
    for name in ("config.json", "tokenizer.json", "catalog.json"):
        path = root / name
        if path.is_file():
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ModelLoadError(f"{path}: not readable JSON ({exc})") from exc
    try:
        return FlashOnnx.load(root, file=file, threads=threads)
    except FileNotFoundError as exc:
        raise ModelLoadError(str(exc)) from exc
    except Exception as exc:  # onnxruntime raises its own types for corrupt graphs
        raise ModelLoadError(f"{root / file}: cannot load the model ({type(exc).__name__}: {exc})") from exc


def _read_side_files(root: Path, bundle: Path | None, *, lenient: bool, model: FlashOnnx | None
                     ) -> tuple[dict[str, Any], Constraints, FallbackBook]:
    """The catalog, constraints and fallback lines of a model directory or verified bundle.

    From a bundle (``bundle`` is its path) every file must be there and parse as the engine
    parses it, or :class:`BundleError` names it. From a model directory a missing file is the
    shipped model's (:func:`read_constraints`, :meth:`FallbackBook.shipped`); a malformed one
    raises :class:`ModelLoadError`, or with ``lenient`` is logged and the shipped one used.
    Neither reads YAML.
    """
    if bundle is not None:
        def read(name: str, parse: Callable[[Path], Any]) -> Any:
            try:
                return parse(root / name)
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise BundleError(f"{bundle}: bundle rejected: {name}: {exc}") from exc
        return (read("catalog.json", _catalog_file), read("constraints.json", constraints_file),
                read("fallbacks.json", FallbackBook.from_json))

    def own_or_shipped(own: Callable[[], Any], shipped: Callable[[], Any]) -> Any:
        try:
            return own()
        except ValueError as exc:
            if not lenient:
                raise ModelLoadError(str(exc)) from exc
            log.exception("unreadable; using the shipped model's file instead")
            return shipped()

    fb_path = root / "fallbacks.json"
    cons = own_or_shipped(lambda: read_constraints(root), lambda: read_constraints(None))
    fallbacks = own_or_shipped(lambda: FallbackBook.from_json(fb_path) if fb_path.is_file() else FallbackBook.shipped(),
                               FallbackBook.shipped)
    return _read_catalog(root, model), cons, fallbacks


def _read_authored(root: Path, bundle: Path | None) -> AuthoredBook | None:
    """The studio's authored lines (``authored.json``) of a model directory or bundle, or None
    where it holds none (the shipped model: its book composes lines, writers did not write
    them whole). A malformed file raises :class:`ModelLoadError` (:class:`BundleError` in a
    bundle) naming it."""
    path = root / "authored.json"
    if not path.is_file():
        return None
    try:
        return AuthoredBook.from_json(path)
    except ValueError as exc:
        if bundle is not None:
            raise BundleError(f"{bundle}: bundle rejected: authored.json: {exc}") from exc
        raise ModelLoadError(str(exc)) from exc


def _catalog_file(path: Path) -> dict[str, Any]:
    import json

    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("archetypes", "states", "intents")):
        raise ValueError("expected an object with archetypes, states and intents lists")
    return dict(data)


def _read_catalog(root: Path, model: FlashOnnx | None) -> dict[str, Any]:
    import json

    if model is not None and model.tokenizer is not None:
        return dict(model.tokenizer.catalog)
    for name in ("catalog.json", "tokenizer.json"):
        path = root / name
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                return dict(data["catalog"] if name == "tokenizer.json" else data)
            except (OSError, ValueError, KeyError):
                continue
    try:  # a model directory without its catalog: the shipped model's (the default line book's)
        return dict(json.loads((DEFAULT_MODEL_DIR / "catalog.json").read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{root}: no catalog.json or tokenizer.json, and no shipped catalog ({exc})") from exc


def _fingerprint(model: FlashOnnx, path: Path) -> str:
    """What prefix cache entries are keyed on: a bundle's model version (a content hash, stable
    across the fresh extraction of a zip at every start), else the model file's size and mtime."""
    bundle = getattr(model, "bundle", None)
    if bundle is not None:
        return f"bundle:{bundle.manifest['model'].get('version', '')}:{bundle.model_file}"
    st = os.stat(path)
    return f"{path.name}:{st.st_size}:{st.st_mtime_ns}"


__all__ = ["AsyncLineStream", "Line", "LineGenerator", "LineRequest", "LineStream", "ModelLoadError",
           "active_params_percent"]
