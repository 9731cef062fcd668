"""The capacity rule's parts: the prefix-cache hit-rate window, the rule's settings, the model
specs of ``serve --dialogue --model NAME=DIR``, and a router's session table."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from runtime.serving.dialogue_service import DialogueService, PrefixHitWindow, SessionNotFound
from runtime.serving.model_router import CapacityRule, ModelRouter, UnknownModel, parse_model_specs


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_window_rate_is_hit_tokens_over_queried_tokens_of_its_last_seconds():
    clock = Clock()
    w = PrefixHitWindow(window_s=10, min_requests=3, clock=clock)
    w.record(8, 8)
    w.record(8, 0)
    assert w.rate() is None  # too few lookups to judge
    w.record(4, 2)
    assert w.rate() == pytest.approx(10 / 20)
    w.record(0, 0)  # nothing cacheable: not a lookup
    assert w.snapshot()["requests"] == 3
    clock.now = 5.0
    w.record(4, 4)
    clock.now = 10.5  # the first three are older than 10 s now
    assert w.rate() is None
    w.record(4, 4)
    w.record(4, 0)
    assert w.rate() == pytest.approx(8 / 12)
    with pytest.raises(ValueError, match="window_s > 0 and min_requests >= 1"):
        PrefixHitWindow(window_s=0)


def test_capacity_rule_settings_are_checked():
    with pytest.raises(ValueError, match=r"capacity hit rate must be in 0\.\.1, got -0\.1"):
        CapacityRule(min_hit_rate=-0.1)
    with pytest.raises(ValueError, match="window_s > 0"):
        CapacityRule(window_s=0)
    with pytest.raises(ValueError, match="--fallback-model lite: not a loaded model \\(models: base\\)"):
        CapacityRule(fallback_model="lite").check_models(["base"])


def test_model_specs_map_names_to_exported_directories_base_first(tiny_model_dir, tmp_path):
    assert parse_model_specs([]) == {"base": None}
    specs = parse_model_specs([f"pirate={tiny_model_dir}", f"lite-2={tiny_model_dir}"], tiny_model_dir)
    assert list(specs) == ["base", "pirate", "lite-2"] and set(specs.values()) == {tiny_model_dir}
    with pytest.raises(ValueError, match=r"--model-dir: .* is not an exported model directory"):
        parse_model_specs([], tmp_path)
    with pytest.raises(ValueError, match="--model =x: expected NAME=DIR"):
        parse_model_specs(["=x"])


async def test_a_router_routes_by_model_and_the_ort_engine_leaves_the_rule_idle(tiny_model_dir):
    # two names over one directory: enough to see the routing and the per-model state
    router = ModelRouter.load({"base": tiny_model_dir, "other": tiny_model_dir},
                              capacity=CapacityRule(min_requests=2), max_batch=4, min_mean_logprob=None,
                              default_deadline_ms=30_000)
    assert isinstance(router.services["other"], DialogueService)
    with pytest.raises(ValueError, match="one model must be named 'base'"):
        ModelRouter({"other": router.services["other"]})
    cat = router.services["base"].catalog
    async with router:
        with pytest.raises(UnknownModel, match=r"unknown model 'x' \(models: base, other\)"):
            router.open_session(cat["archetypes"][0], state=cat["states"][0], model="x")
        a = router.open_session(cat["archetypes"][0], state=cat["states"][0])
        b = router.open_session(cat["archetypes"][0], state=cat["states"][0], model="other", essential=False)
        assert a != b and router.model_of(b) == "other" and router.num_sessions == 2
        for seed in range(4):
            line = await router.request_line(b, cat["intents"][0], seed=seed, max_tokens=4)
            assert line.served_by in ("other", "authored")
        assert router.services["other"].num_sessions == 1 and router.services["base"].num_sessions == 1
        # the onnxruntime engine has no prefix cache: nothing is measured, nothing is shed
        assert router.services["other"].prefix_window.rate() is None and not router.shedding("other")
        health = router.health()
        assert set(health["models"]) == {"base", "other"} and health["sessions"] == 2
        router.close_session(b)
        with pytest.raises(SessionNotFound):
            router.model_of(b)
        assert b"flashnpc_served_lines_total" in router.exposition()
