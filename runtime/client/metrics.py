"""Prometheus metrics of a :class:`runtime.client.generator.LineGenerator`, named in the style of vLLM's.

Each generator owns a :class:`prometheus_client.CollectorRegistry` (so several generators, and
tests, never collide); every sample carries a ``model_name`` label. Expose one generator with
``metrics.exposition()``, several with :func:`exposition` over their registries, or hang them
on the process-wide registry with :func:`register_global`.

============================================  =========  ============================================
name                                          type       meaning
============================================  =========  ============================================
flashnpc_prefix_cache_queried_tokens_total    counter    prefix tokens looked up in the prefix KV cache
flashnpc_prefix_cache_hit_tokens_total        counter    prefix tokens found there
flashnpc_time_to_first_token_seconds          histogram  request start to first decoded token
flashnpc_line_latency_seconds                 histogram  request start to finished line (fallbacks too)
flashnpc_generation_tokens_total              counter    tokens decoded by the model
flashnpc_lines_total                          counter    lines returned, by ``source`` (model, fallback)
flashnpc_fallback_lines_total                 counter    fallback lines, by ``reason``
flashnpc_active_params_ratio                  gauge      share (0-1) of parameters a decoded token touches
flashnpc_router_confidence_ratio              gauge      mean top-1 router probability (0-1), last line
============================================  =========  ============================================

Names follow Prometheus conventions (docs/metrics.md): one ``flashnpc_`` prefix, base units in
the name (``_seconds``, ``_tokens``), ``_total`` on counters, ratios in 0-1, durations as
histograms.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import REGISTRY, Collector

FALLBACK_REASONS = ("deadline", "model_error", "unusable", "repeat", "model_unavailable", "cancelled")
_LATENCY_BUCKETS = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25,
                    0.5, 1.0, 2.5)


class EngineMetrics:
    """The metric objects of one generator, registered in ``self.registry``."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None) -> None:
        self.model_name = model_name
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        labels = ["model_name"]
        r = self.registry
        self._queries = Counter("flashnpc_prefix_cache_queried_tokens",
                                "Prefix tokens looked up in the prefix KV cache.", labels, registry=r)
        self._hits = Counter("flashnpc_prefix_cache_hit_tokens", "Prefix tokens found in the prefix KV cache.",
                             labels, registry=r)
        self._ttft = Histogram("flashnpc_time_to_first_token_seconds",
                               "Time from request start to the first token.", labels,
                               buckets=_LATENCY_BUCKETS, registry=r)
        self._latency = Histogram("flashnpc_line_latency_seconds", "Time from request start to a finished line.",
                                  labels, buckets=_LATENCY_BUCKETS, registry=r)
        self._tokens = Counter("flashnpc_generation_tokens", "Tokens decoded by the model.", labels, registry=r)
        self._lines = Counter("flashnpc_lines", "Lines returned, by source.", [*labels, "source"], registry=r)
        self._fallbacks = Counter("flashnpc_fallback_lines", "Fallback lines returned, by reason.",
                                  [*labels, "reason"], registry=r)
        self._active = Gauge("flashnpc_active_params_ratio",
                             "Share (0-1) of the model's parameters a decoded token touches.",
                             labels, registry=r)
        self._router = Gauge("flashnpc_router_confidence_ratio",
                             "Mean top-1 router probability (0-1) over the last model line's tokens.",
                             labels, registry=r)
        for reason in FALLBACK_REASONS:  # export zeros, so rates work from the first scrape
            self._fallbacks.labels(model_name, reason)
        for source in ("model", "fallback"):
            self._lines.labels(model_name, source)
        self.queries = self._queries.labels(model_name)
        self.hits = self._hits.labels(model_name)
        self.ttft = self._ttft.labels(model_name)
        self.latency = self._latency.labels(model_name)
        self.tokens = self._tokens.labels(model_name)
        self.active_params = self._active.labels(model_name)
        self.router_confidence = self._router.labels(model_name)

    def line(self, *, fallback: bool, reason: str | None, latency_s: float, ttft_s: float | None,
             tokens: int, router_confidence: float | None) -> None:
        """Record one returned line."""
        self.latency.observe(latency_s)
        self._lines.labels(self.model_name, "fallback" if fallback else "model").inc()
        if fallback:
            self._fallbacks.labels(self.model_name, reason or "unknown").inc()
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        if tokens:
            self.tokens.inc(tokens)
        if router_confidence is not None and not fallback:
            self.router_confidence.set(router_confidence)

    def set_active_params_percent(self, percent: float) -> None:
        """Record the share of parameters a decoded token touches, given in percent (as
        :func:`runtime.client.generator.active_params_percent` computes it); the gauge holds
        the 0-1 ratio."""
        self.active_params.set(percent / 100.0)

    def prefix_query(self, tokens: int, hit: bool) -> None:
        """Record one prefix-cache lookup of ``tokens`` prefix tokens (found or not)."""
        self.queries.inc(tokens)
        if hit:
            self.hits.inc(tokens)

    def value(self, name: str, **labels: str) -> float:
        """The current value of one sample (0.0 if absent), e.g. ``value("flashnpc_generation_tokens_total")``."""
        v = self.registry.get_sample_value(name, {"model_name": self.model_name, **labels})
        return 0.0 if v is None else float(v)

    def exposition(self) -> bytes:
        """This generator's metrics in the Prometheus text format."""
        return generate_latest(self.registry)


class _Merged(Collector):
    """Yields the metric families of several registries, samples of equal names merged."""

    def __init__(self, registries: Iterable[CollectorRegistry]) -> None:
        self.registries = list(registries)

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for reg in self.registries:
            for fam in reg.collect():
                have = merged.get(fam.name)
                if have is None:
                    have = merged[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                have.samples.extend(fam.samples)
        yield from merged.values()


def exposition(registries: Iterable[CollectorRegistry]) -> bytes:
    """Several generators' metrics as one Prometheus text page (give them distinct model names)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Merged(registries))
    return generate_latest(reg)


def register_global(registries: Iterable[CollectorRegistry], target: CollectorRegistry = REGISTRY) -> Collector:
    """Hang generators' registries on ``target`` (the process-wide default registry), e.g. for
    ``prometheus_client.start_http_server``; returns the collector (to unregister it later)."""
    collector = _Merged(registries)
    target.register(collector)
    return collector


__all__ = ["FALLBACK_REASONS", "EngineMetrics", "exposition", "register_global"]
