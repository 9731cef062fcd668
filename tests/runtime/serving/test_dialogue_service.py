"""Dialogue sessions over the batched engine: lines, deadlines, admission control, the breaker,
the opt-out lane, streaming, metrics, and a few hundred concurrent sessions."""

from __future__ import annotations

import asyncio

import pytest

from runtime.client.constraints import read_constraints
from runtime.client.fallback import FallbackBook
from runtime.client.onnx_model import FlashOnnx
from runtime.serving.batched_engine import BatchedEngine, load_flash
from runtime.serving.dialogue_service import Busy, CircuitBreaker, DialogueService, SessionNotFound
from runtime.serving.ort_engine import OrtBatchedEngine


@pytest.fixture(scope="module", params=["torch", "ort"])
def loaded(request, tiny_model_dir):
    """(model, tokenizer, root, engine kind): every test runs on both engines."""
    model, tok, root = load_flash(tiny_model_dir)
    return model, tok, root, request.param


def service(loaded, *, max_batch: int = 32, solo: bool = True, **kw) -> DialogueService:
    model, tok, root, kind = loaded
    cons = read_constraints(root)
    words = cons.word_constraint(tok)
    if kind == "ort":
        onnx = FlashOnnx.load(root)
        eng: BatchedEngine = OrtBatchedEngine(onnx, max_batch=max_batch, words=words)
        solo_eng: BatchedEngine | None = OrtBatchedEngine(onnx, max_batch=1, words=words) if solo else None
    else:
        eng = BatchedEngine(model, tok, max_batch=max_batch, words=words)
        solo_eng = BatchedEngine(model, tok, max_batch=1, words=words, use_block_cache=False) if solo else None
    kw.setdefault("default_deadline_ms", 30_000)
    kw.setdefault("min_mean_logprob", None)  # the tiny model is random: keep its lines
    return DialogueService(eng, fallbacks=FallbackBook.from_json(root / "fallbacks.json"), catalog=tok.catalog,
                           slot_rules=cons.slot_rules, solo_engine=solo_eng, **kw)


def first(loaded, key: str) -> str:
    return loaded[1].catalog[key][0]


async def test_start_warms_every_engine_up_with_a_full_batch(loaded):
    svc = service(loaded, max_batch=8)
    assert svc.engine.steps == 0
    async with svc:
        assert svc.engine.steps > 0 and svc._lanes["solo"].engine.steps > 0
        # 8 rows x 4 tokens, less where the word constraints leave the random model a dead end
        assert 8 * 3 < svc.engine.tokens_generated <= 8 * 4
    async with service(loaded, max_batch=8, warm_up=False) as cold:
        assert cold.engine.steps == 0


async def test_a_session_gets_a_line_and_its_state_can_change(loaded):
    async with service(loaded) as svc:
        sid = svc.open_session(first(loaded, "archetypes"), state=first(loaded, "states"))
        line = await svc.request_line(sid, first(loaded, "intents"), seed=1, max_tokens=8)
        assert line.session_id == sid and line.text
        assert line.fallback or (line.tokens and not line.fallback_reason)
        new_state = loaded[1].catalog["states"][1]
        assert svc.update_state(sid, state=new_state).state == new_state
        with pytest.raises(ValueError, match="state"):
            svc.update_state(sid, state="dancing")
        svc.close_session(sid)
        with pytest.raises(SessionNotFound):
            await svc.request_line(sid, first(loaded, "intents"))


async def test_same_seed_same_line_whatever_else_is_in_the_batch(loaded):
    async with service(loaded) as svc:
        arch, state, intent = first(loaded, "archetypes"), first(loaded, "states"), first(loaded, "intents")
        sids = [svc.open_session(arch, state=state) for _ in range(12)]
        together = await asyncio.gather(*[svc.request_line(s, intent, seed=7, max_tokens=10) for s in sids])
        alone = await svc.request_line(svc.open_session(arch, state=state), intent, seed=7, max_tokens=10)
        assert {line.tokens for line in together} == {alone.tokens}


async def test_past_its_deadline_a_request_gets_a_marked_fallback_line(loaded):
    async with service(loaded) as svc:
        sid = svc.open_session(first(loaded, "archetypes"), state=first(loaded, "states"))
        line = await svc.request_line(sid, first(loaded, "intents"), deadline_ms=0)
        assert line.fallback and line.fallback_reason == "deadline" and line.text
        assert svc.metrics.value("flashnpc_fallback_lines_total", reason="deadline") == 1


async def test_a_full_queue_answers_busy_with_a_retry_time(loaded):
    async with service(loaded, max_batch=1, max_queue=1) as svc:
        sid = svc.open_session(first(loaded, "archetypes"), state=first(loaded, "states"))
        results = await asyncio.gather(*[svc.request_line(sid, first(loaded, "intents"), seed=i, max_tokens=4)
                                         for i in range(4)], return_exceptions=True)
        busy = [r for r in results if isinstance(r, Busy)]
        assert len(busy) == 2 and all(b.retry_after_ms >= 10 for b in busy)
        assert "retry after" in str(busy[0])
        assert svc.metrics.value("flashnpc_requests_rejected_total") == 2


def test_breaker_opens_on_error_rate_and_closes_after_good_probes():
    now = [0.0]
    b = CircuitBreaker(p95_budget_ms=100, min_requests=20, cooldown_s=5, probes=2, clock=lambda: now[0])
    for i in range(40):
        b.record(ok=(i % 10 != 0), latency_ms=10)  # 10% errors
        now[0] += 0.1
    assert b.state == "open" and "error rate" in (b.reason or "")
    assert not b.allow() and b.allow(critical=True)
    now[0] += 5
    assert b.allow() and b.allow() and not b.allow()  # half-open: two probes
    b.record(True, 10)
    b.record(True, 10)
    assert b.state == "closed" and b.allow()


def test_breaker_opens_on_p95_latency_and_a_failed_probe_reopens_it():
    now = [0.0]
    b = CircuitBreaker(p95_budget_ms=100, min_requests=10, cooldown_s=5, probes=3, clock=lambda: now[0])
    for _ in range(10):
        b.record(True, 250)
    assert b.state == "open" and "p95" in (b.reason or "")
    now[0] += 6
    assert b.allow()
    b.record(True, 500)  # too slow: back to open
    assert b.state == "open"


def test_breaker_forgets_outcomes_older_than_its_window():
    now = [0.0]
    b = CircuitBreaker(p95_budget_ms=100, min_requests=5, window_s=60, clock=lambda: now[0])
    for _ in range(4):
        b.record(False, 10)
    now[0] += 61
    for _ in range(5):
        b.record(True, 10)
    assert b.state == "closed"


async def test_an_open_breaker_degrades_health_and_serves_fallbacks_to_non_critical_requests(loaded):
    now = [0.0]
    breaker = CircuitBreaker(p95_budget_ms=1000, min_requests=2, cooldown_s=60, clock=lambda: now[0])
    async with service(loaded, breaker=breaker) as svc:
        sid = svc.open_session(first(loaded, "archetypes"), state=first(loaded, "states"))
        assert svc.health()["status"] == "ok"
        breaker.record(False, 10)
        breaker.record(False, 10)
        assert svc.health()["status"] == "degraded"
        line = await svc.request_line(sid, first(loaded, "intents"))
        assert line.fallback and line.fallback_reason == "breaker_open"
        critical = await svc.request_line(sid, first(loaded, "intents"), critical=True, max_tokens=4)
        assert critical.fallback_reason != "breaker_open"
        assert b"flashnpc_breaker_state" in svc.exposition()


async def test_opted_out_requests_run_in_their_own_lane(loaded):
    async with service(loaded) as svc:
        sid = svc.open_session(first(loaded, "archetypes"), state=first(loaded, "states"))
        solo, batched = svc._lanes["solo"].engine, svc.engine
        solo0, batched0 = solo.steps, batched.steps  # after the warm-up
        await svc.request_line(sid, first(loaded, "intents"), batch=False, seed=3, max_tokens=6)
        assert solo.steps > solo0 and batched.steps == batched0


async def test_streamed_pieces_make_up_the_line(loaded):
    async with service(loaded) as svc:
        sid = svc.open_session(first(loaded, "archetypes"), state=first(loaded, "states"))
        items = [x async for x in svc.stream_line(sid, first(loaded, "intents"), seed=11, max_tokens=12)]
        line = items[-1]
        assert "".join(items[:-1]) == line.text


async def test_metrics_use_flashnpc_names_with_per_tier_cache_hits(loaded):
    async with service(loaded) as svc:
        arch, state, intent = first(loaded, "archetypes"), first(loaded, "states"), first(loaded, "intents")
        sid = svc.open_session(arch, state=state)
        for seed in range(3):
            await svc.request_line(sid, intent, seed=seed, max_tokens=4)
        text = svc.exposition().decode()
        for name in ("flashnpc_requests_running", "flashnpc_requests_waiting", "flashnpc_batch_rows_bucket",
                     "flashnpc_time_to_first_token_seconds", "flashnpc_inter_token_latency_seconds",
                     "flashnpc_line_latency_seconds", "flashnpc_generation_tokens_total", "flashnpc_active_params_ratio",
                     "flashnpc_router_confidence_ratio", "flashnpc_fallback_lines_total", "flashnpc_breaker_state"):
            assert name in text, name
        assert 'tier="l3"' in text
        if loaded[3] == "torch":  # the onnxruntime engine keeps no prefix block cache
            assert svc.metrics.value("flashnpc_prefix_cache_hit_tokens_total", tier="l1") > 0


async def test_three_hundred_concurrent_sessions_all_get_lines(loaded):
    cat = loaded[1].catalog
    async with service(loaded, max_batch=128, max_queue=512) as svc:
        sids = [svc.open_session(cat["archetypes"][i % 3], state=cat["states"][i % 2],
                                 persona=[cat["persona_traits"][i % 4]]) for i in range(300)]
        lines = await asyncio.gather(*[svc.request_line(s, cat["intents"][i % 3], seed=i, max_tokens=6)
                                       for i, s in enumerate(sids)])
        assert len(lines) == 300 and all(line.text for line in lines)
        assert not any(line.fallback_reason in ("model_error", "deadline") for line in lines)
        assert svc.health()["in_flight"] == 0


async def test_a_stream_for_an_unknown_session_raises_instead_of_hanging(loaded):
    async with service(loaded) as svc:
        with pytest.raises(SessionNotFound):
            async for _ in svc.stream_line("nope", first(loaded, "intents")):
                pass
