"""Prometheus metrics of the engine: per-generator registries that move with the work done."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from runtime import LineGenerator
from runtime.client.metrics import EngineMetrics, exposition, register_global


def test_metrics_move_with_lines_tokens_cache_and_fallbacks(tiny_model_dir):
    gen = LineGenerator.load(tiny_model_dir, name="m1", min_mean_logprob=None)
    m = gen.metrics
    assert m.value("flashnpc_generation_tokens_total") == 0  # warm-up is not counted
    assert m.value("flashnpc_active_params_ratio") == pytest.approx(gen.active_params_pct / 100)
    assert 0 < m.value("flashnpc_active_params_ratio") < 1
    a = gen.generate("guard", "patrol", seed=1, npc_id=1)
    b = gen.generate("guard", "patrol", seed=2, npc_id=2)
    gen.generate("guard", "patrol", seed=3, deadline_ms=0)
    model_lines = [x for x in (a, b) if not x.fallback]
    assert m.value("flashnpc_generation_tokens_total") == sum(len(x.tokens) for x in model_lines)
    assert m.value("flashnpc_line_latency_seconds_count") == 3
    assert m.value("flashnpc_time_to_first_token_seconds_count") == 2
    assert m.value("flashnpc_fallback_lines_total", reason="deadline") == 1
    assert m.value("flashnpc_lines_total", source="fallback") == 1 + (2 - len(model_lines))
    _, plen = gen.tokenizer.encode_prompt("guard", (), "patrol", "approach")
    attempts = a.attempts + b.attempts  # a resampled line queries the cache again
    assert m.value("flashnpc_prefix_cache_queried_tokens_total") == attempts * plen
    assert m.value("flashnpc_prefix_cache_hit_tokens_total") == (attempts - 1) * plen
    assert 0 < m.value("flashnpc_router_confidence_ratio") <= 1


def test_exposition_merges_generators_and_registries_do_not_collide():
    a, b = EngineMetrics("alpha"), EngineMetrics("beta")
    a.tokens.inc(3)
    b.tokens.inc(5)
    text = exposition([a.registry, b.registry]).decode()
    assert 'flashnpc_generation_tokens_total{model_name="alpha"} 3.0' in text
    assert 'flashnpc_generation_tokens_total{model_name="beta"} 5.0' in text
    assert text.count("# TYPE flashnpc_generation_tokens_total counter") == 1
    target = CollectorRegistry()
    register_global([a.registry], target)
    assert 'flashnpc_fallback_lines_total{model_name="alpha",reason="deadline"} 0.0' in generate_latest(target).decode()
