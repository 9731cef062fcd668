"""LineGenerator on a tiny random model: determinism, constraints, caching, fallbacks, async, streaming."""

from __future__ import annotations

import itertools
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from runtime import Line, LineGenerator, LineRequest, ModelLoadError
from runtime.factory.text_metrics import banned_hits


@pytest.fixture(scope="module")
def gen(tiny_model_dir):
    return fresh(tiny_model_dir)


def fresh(tiny_model_dir, **options):
    """A generator on the tiny random model; its gibberish is accepted unless a test asks otherwise."""
    options.setdefault("min_mean_logprob", None)
    return LineGenerator.load(tiny_model_dir, **options)


def test_load_warms_up_and_catalog_lists_what_the_model_understands(gen, tiny_model_dir):
    cat = gen.catalog()
    assert "guard" in cat["archetypes"] and "patrol" in cat["states"] and "approach" in cat["intents"]
    assert "night" in cat["context"]["time_of_day"] and "player" in cat["slots"]
    assert set(cat["persona_traits"]) >= {"gruff", "kind"}
    assert gen.load_ms is not None and gen.load_ms > 0
    assert gen._step_s > 0  # the warm-up decoded (and timed) real steps
    assert fresh(tiny_model_dir).stats()["lines"] == 0
    cold = fresh(tiny_model_dir, warmup=False)
    assert cold._step_s == 0 and cold.stats()["lines"] == 0


def test_a_line_carries_its_timings_and_model_facts(gen):
    line = gen.generate("guard", "patrol", seed=5, npc_id="t1")
    assert isinstance(line, Line) and line.text
    assert line.latency_ms > 0 and 0 < line.active_params_pct < 100
    if not line.fallback:
        assert line.tokens and line.ttft_ms is not None and line.ttft_ms <= line.latency_ms
        assert 0 < line.router_confidence <= 1


def test_the_same_seed_gives_the_same_line(tiny_model_dir):
    a, b = fresh(tiny_model_dir), fresh(tiny_model_dir)
    kw = dict(persona=["gruff"], intent="greet", context={"time_of_day": "night"}, temperature=1.0)
    for seed in range(5):
        la, lb = a.generate("guard", "alert", seed=seed, **kw), b.generate("guard", "alert", seed=seed, **kw)
        assert (la.text, la.tokens) == (lb.text, lb.tokens)
    texts = {a.generate("guard", "alert", seed=s, npc_id=s, **kw).text for s in range(10, 20)}
    assert len(texts) > 5


def test_banned_words_never_appear_across_many_seeds(tiny_model_dir):
    # common words the random model emits often, so the mask has something to block
    common = ["the", "and", "me", "be", "at", "an", "no", "my", "here", "not"]
    plain = fresh(tiny_model_dir, max_resamples=0)
    unmasked = [plain.generate("guard", "idle", seed=s, npc_id=s, temperature=1.2, top_p=1.0).raw_text
                for s in range(60)]
    assert sum(bool(banned_hits(t, common)) for t in unmasked) > 10  # the words do come up unmasked
    gen = fresh(tiny_model_dir, max_resamples=0)
    gen.mask = type(gen.mask)(gen.banned_words + common, gen.tokenizer)
    for seed in range(60):
        line = gen.generate("guard", "idle", seed=seed, npc_id=seed, temperature=1.2, top_p=1.0)
        if not line.fallback:
            assert banned_hits(line.raw_text, gen.banned_words + common) == [], line.raw_text


def test_a_repeat_is_resampled(tiny_model_dir):
    gen = fresh(tiny_model_dir)
    first = gen.generate("merchant", "working", seed=11, npc_id="bob", player_id="p1")
    again = gen.generate("merchant", "working", seed=11, npc_id="bob", player_id="p1")
    other = gen.generate("merchant", "working", seed=11, npc_id="bob", player_id="p2")
    assert not first.fallback
    assert again.text != first.text and (again.attempts == 2 or again.fallback_reason == "repeat")
    assert other.text == first.text  # another player has not heard it


def test_gibberish_from_a_guessing_model_is_unusable_and_falls_back_without_resampling(tiny_model_dir):
    gen = LineGenerator.load(tiny_model_dir)  # default min_mean_logprob: -5 nats per token
    accepting = fresh(tiny_model_dir)
    checked = 0
    for seed in range(8):
        line = gen.generate("guard", "patrol", seed=seed, npc_id=seed)
        raw = accepting.generate("guard", "patrol", seed=seed, npc_id=seed)
        if raw.fallback:  # a random model's draw the engine refuses on other grounds: nothing to compare
            continue
        checked += 1
        assert raw.mean_logprob < -5
        # the first usable-or-not draw is the last: no resample for an unusable line (a draw the
        # word checks refuse first is redrawn, in both engines alike)
        assert line.fallback and line.fallback_reason == "unusable" and line.attempts == raw.attempts
        assert line.text in gen.fallbacks.candidates("guard", "patrol", "approach")  # the default intent
    assert checked >= 5


def test_a_zero_deadline_returns_a_fallback_at_once(gen):
    line = gen.generate("guard", "alert", seed=1, deadline_ms=0)
    assert line.fallback and line.fallback_reason == "deadline" and line.tokens == ()
    assert line.text in gen.fallbacks.candidates("guard", "alert", "approach")


def test_fallbacks_are_never_the_same_twice_in_a_row_for_one_npc(gen):
    said = [gen.generate("guard", "combat", seed=s, deadline_ms=0, npc_id="g7").text for s in range(20)]
    assert all(a != b for a, b in itertools.pairwise(said))


class Broken:
    """Wraps a FlashOnnx whose session fails mid-line."""

    def __init__(self, model, fail_after: int = 3) -> None:
        self._m, self.calls, self.fail_after = model, 0, fail_after

    def __getattr__(self, name):
        return getattr(self._m, name)

    def step(self, *args, **kwargs):
        self.calls += 1
        if self.calls > self.fail_after:
            raise RuntimeError("onnxruntime exploded")
        return self._m.step(*args, **kwargs)


def test_a_model_error_returns_a_fallback_not_an_exception(tiny_model_dir):
    gen = fresh(tiny_model_dir)
    gen.model = Broken(gen.model)
    line = gen.generate("priest", "idle", seed=2)
    assert line.fallback and line.fallback_reason == "model_error"
    assert gen.stats()["fallback_reasons"] == {"model_error": 1}


def test_a_corrupt_or_missing_model_raises_at_load_naming_the_file(tiny_model_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_model_dir, bad)
    (bad / "model.int4.onnx").write_bytes(b"definitely not onnx")
    with pytest.raises(ModelLoadError, match=r"bad/model\.int4\.onnx"):
        LineGenerator.load(bad)
    (bad / "model.int4.onnx").unlink()
    with pytest.raises(ModelLoadError, match=r"model\.int4\.onnx: missing"):
        LineGenerator.load(bad)


@pytest.mark.parametrize("name", ["tokenizer.json", "config.json", "fallbacks.json"])
def test_a_corrupt_side_file_raises_naming_it(tiny_model_dir, tmp_path, name):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_model_dir, bad)
    (bad / name).write_text("{ not json")
    with pytest.raises(ModelLoadError, match=name.replace(".", r"\.")):
        LineGenerator.load(bad)


def test_fallback_mode_serves_authored_lines_when_the_model_cannot_load(tiny_model_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_model_dir, bad)
    (bad / "model.int4.onnx").write_bytes(b"\x00" * 64)
    gen = LineGenerator.load(bad, on_error="fallback")
    assert gen.model is None
    line = gen.generate("guard", "patrol", seed=0)
    assert line.fallback and line.fallback_reason == "model_unavailable"
    with pytest.raises(ValueError, match="unknown archetype 'dragon'"):
        gen.generate("dragon", "patrol")


def test_bad_requests_raise_listing_the_known_values(gen):
    with pytest.raises(ValueError, match=r"unknown archetype 'gaurd'; known: guard"):
        gen.generate("gaurd", "patrol")
    with pytest.raises(ValueError, match="unknown state 'sleeping'"):
        gen.generate("guard", "sleeping")
    with pytest.raises(ValueError, match="unknown intent 'dance'"):
        gen.generate("guard", "patrol", intent="dance")
    with pytest.raises(ValueError, match="unknown persona trait"):
        gen.generate("guard", "patrol", persona=["grumpy"])
    with pytest.raises(ValueError, match=r"unknown context key 'mood'.*time_of_day.*player"):
        gen.generate("guard", "patrol", context={"mood": "sad"})
    with pytest.raises(ValueError, match="value for context slot 'weather'"):
        gen.generate("guard", "patrol", context={"weather": "acid"})
    with pytest.raises(ValueError, match="temperature"):
        gen.generate("guard", "patrol", temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        gen.generate("guard", "patrol", top_p=0)
    with pytest.raises(ValueError, match="max_tokens"):
        gen.generate("guard", "patrol", max_tokens=0)
    with pytest.raises(ValueError, match="deadline_ms"):
        gen.generate("guard", "patrol", deadline_ms=-5)


def test_cached_prefix_logits_equal_a_cold_computation(tiny_model_dir):
    gen = fresh(tiny_model_dir)
    kw = dict(persona=["kind", "shy"], intent="ask_rumors", context={"weather": "fog", "recent_event": "fire"})
    cold = gen.prefix_logits("innkeeper", "friendly", cached=False, **kw)
    miss = gen.prefix_logits("innkeeper", "friendly", cached=True, **kw)
    hit = gen.prefix_logits("innkeeper", "friendly", cached=True, **kw)
    np.testing.assert_allclose(miss, cold, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(hit, cold, rtol=1e-5, atol=1e-5)
    assert gen.prefix_cache.stats.hits_tokens == 5  # bos, archetype, 2 traits, state: counted in tokens
    line_on = gen.generate("innkeeper", "friendly", seed=4, temperature=0, **kw)
    off = fresh(tiny_model_dir, use_prefix_cache=False)
    line_off = off.generate("innkeeper", "friendly", seed=4, temperature=0, **kw)
    assert line_on.prefix_cache_hit and not line_off.prefix_cache_hit
    assert line_on.tokens == line_off.tokens


def test_the_disk_cache_makes_prefixes_warm_after_a_restart(tiny_model_dir, tmp_path):
    # one sample each (no resample, which would hit the prefix its first attempt stored)
    first = fresh(tiny_model_dir, cache_dir=tmp_path / "kv", max_resamples=0)
    assert not first.generate("sailor", "rest", seed=1).prefix_cache_hit
    restarted = fresh(tiny_model_dir, cache_dir=tmp_path / "kv", max_resamples=0)
    assert len(restarted.prefix_cache) == 1
    assert restarted.generate("sailor", "rest", seed=1).prefix_cache_hit


def test_stream_pieces_concatenate_to_the_generated_text(tiny_model_dir):
    a, b = fresh(tiny_model_dir), fresh(tiny_model_dir)
    for seed in range(6):
        kw = dict(seed=seed, npc_id=seed, context={"player": "Aria"}, temperature=1.0, max_tokens=32)
        stream = a.generate_stream("thief", "idle", **kw)
        pieces = list(stream)
        line = b.generate("thief", "idle", **kw)
        assert "".join(pieces) == stream.line.text
        # (a sample the constraints stop is drawn again: by generate from its last sentence end,
        # by a stream from no earlier than what it has shown, so the two differ from there on)
        assert stream.line.text == line.text or (line.attempts > 1 and stream.line.attempts > 1)
        if not line.fallback:
            assert len(pieces) > 1


def test_slots_are_filled_and_unfillable_slots_are_never_generated(tiny_model_dir):
    # no slot defaults here: a slot the request leaves unfilled is then never sampled
    gen = fresh(tiny_model_dir, max_resamples=0, slot_defaults={})
    filled = 0
    for seed in range(40):
        named = gen.generate("guard", "alert", seed=seed, npc_id=seed, context={"player": "Aria"}, temperature=1.5,
                             top_p=1.0)
        if "{player}" in named.raw_text:
            filled += 1
            assert "Aria" in named.text and "{player}" not in named.text
        unnamed = gen.generate("guard", "alert", seed=seed, npc_id=-seed - 1, temperature=1.5, top_p=1.0)
        assert "{" not in unnamed.raw_text
    assert filled > 0


def test_concurrent_calls_from_threads_match_sequential_ones(tiny_model_dir):
    gen = fresh(tiny_model_dir)
    ref = fresh(tiny_model_dir)
    seeds = list(range(24))
    expected = [ref.generate("farmer", "working", seed=s, npc_id=s).text for s in seeds]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda s: gen.generate("farmer", "working", seed=s, npc_id=s).text, seeds))
    assert got == expected
    assert gen.stats()["lines"] == len(seeds)


def test_batch_lines_come_back_in_order_and_match_single_greedy_calls(tiny_model_dir):
    gen, ref = fresh(tiny_model_dir), fresh(tiny_model_dir)
    reqs = [LineRequest("noble", "idle", seed=s, npc_id=s, temperature=0, max_tokens=12, min_tokens=s % 5)
            for s in range(8)]
    reqs.append(LineRequest("child", "flee", persona=["shy"], seed=99, npc_id=99, batch=False))
    lines = gen.generate_batch(reqs)
    assert len(lines) == 9
    singles = [ref.generate(r.npc, r.state, persona=r.persona, seed=r.seed, npc_id=r.npc_id,
                            temperature=r.temperature, max_tokens=r.max_tokens, min_tokens=r.min_tokens)
               for r in reqs]
    assert [x.tokens for x in lines] == [x.tokens for x in singles]


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_batch_of_different_prompt_shapes_is_padded_and_matches_single_calls(tiny_model_dir, use_cache):
    gen, ref = fresh(tiny_model_dir, use_prefix_cache=use_cache), fresh(tiny_model_dir, use_prefix_cache=use_cache)
    shapes = [dict(persona=[]), dict(persona=["kind"]), dict(persona=["gruff", "proud"], context={"weather": "rain"}),
              dict(context={"weather": "snow", "time_of_day": "dusk", "reputation": "hostile"}),
              dict(persona=["sly"], intent="trade")]
    reqs = [LineRequest(["guard", "thief", "sailor", "priest", "child"][i], "idle", seed=i, npc_id=i, temperature=0,
                        max_tokens=10, **shape) for i, shape in enumerate(shapes)]
    lines = gen.generate_batch(reqs)
    singles = [ref.generate_request(r) for r in reqs]
    assert [x.tokens for x in lines] == [x.tokens for x in singles]
    assert len({len(gen.tokenizer.encode_prompt(r.npc, r.persona or (), r.state, r.intent, r.context or {})[0])
                for r in reqs}) > 1


def test_submit_resolves_futures_and_poll_reports_each_once(tiny_model_dir):
    with fresh(tiny_model_dir) as gen:
        futs = [gen.submit("blacksmith", "working", seed=s, npc_id=s) for s in range(4)]
        lines = [f.result(timeout=30) for f in futs]
        assert all(isinstance(x, Line) for x in lines)
        polled = gen.poll()
        assert {id(f) for f, _ in polled} == {id(f) for f in futs}
        assert gen.poll() == []


def test_poll_answers_a_request_whose_deadline_passed_while_the_worker_was_busy(tiny_model_dir):
    gate = threading.Event()

    class Slow(Broken):
        def step(self, *args, **kwargs):
            gate.wait(timeout=30)
            return self._m.step(*args, **kwargs)

    gen = fresh(tiny_model_dir)
    gen.model = Slow(gen.model)
    busy = gen.submit("guard", "patrol", seed=1)
    late = gen.submit("guard", "alert", seed=2, deadline_ms=5)
    end = time.perf_counter() + 30
    answered: list = []
    while not answered and time.perf_counter() < end:
        answered = [line for f, line in gen.poll() if f is late]
    gate.set()
    assert answered and answered[0].fallback and answered[0].fallback_reason == "deadline"
    assert late.result() is answered[0]
    assert isinstance(busy.result(timeout=30), Line)
    gen.close()
    # the abandoned decode did not take a turn in the NPC's fallback rotation
    assert gen.fallbacks._last[("guard", None)] == answered[0].text


def test_a_deadline_that_passes_mid_line_returns_a_fallback(tiny_model_dir):
    class Sluggish(Broken):
        def step(self, *args, **kwargs):
            time.sleep(0.002)  # a model slower than the deadline allows (not synchronisation)
            return self._m.step(*args, **kwargs)

    gen = fresh(tiny_model_dir)
    gen.model = Sluggish(gen.model)
    line = gen.generate("guard", "alert", seed=3, deadline_ms=15, max_tokens=32, min_tokens=32)
    assert line.fallback and line.fallback_reason == "deadline"
    assert line.ttft_ms is not None  # it had started decoding


def test_stop_strings_cut_the_line_before_them(tiny_model_dir):
    gen, ref = fresh(tiny_model_dir), fresh(tiny_model_dir)
    cut = 0
    for seed in range(20):
        full = ref.generate("farmer", "idle", seed=seed, npc_id=seed, temperature=1.0, max_tokens=32)
        line = gen.generate("farmer", "idle", seed=seed, npc_id=seed, temperature=1.0, max_tokens=32,
                            stop=[" a", "e"])
        if line.fallback or full.fallback or full.attempts != 1:
            continue  # a full line drawn again was not the sample the cut line stopped in
        assert " a" not in line.raw_text and "e" not in line.raw_text
        assert full.raw_text.startswith(line.raw_text)
        cut += line.finish_reason == "stop"
    assert cut > 0


def test_a_stream_with_no_time_yields_the_fallback_line(gen):
    stream = gen.generate_stream("noble", "alert", seed=1, deadline_ms=0)
    assert list(stream) == [stream.line.text] and stream.line.fallback


def test_warm_prefixes_fill_the_cache_and_domains_keep_their_ttl(tiny_model_dir):
    gen = fresh(tiny_model_dir, cache_ttl={"barks": 3600.0}, default_ttl=1e-9)
    reqs = [LineRequest("guard", s, domain="barks") for s in ("patrol", "alert")]
    assert gen.warm_prefixes(reqs) == 2 and gen.warm_prefixes(reqs) == 0
    assert gen.generate("guard", "alert", seed=1, domain="barks").prefix_cache_hit
    gen.generate("guard", "idle", seed=1)  # default domain: expires at once
    assert not gen.generate("guard", "idle", seed=2).prefix_cache_hit


def test_close_answers_queued_requests_with_fallbacks(tiny_model_dir):
    gate = threading.Event()

    class Blocked(Broken):
        def step(self, *args, **kwargs):
            gate.wait(timeout=30)
            return self._m.step(*args, **kwargs)

    gen = fresh(tiny_model_dir)
    gen.model = Blocked(gen.model)
    first = gen.submit("guard", "patrol", seed=1)
    queued = gen.submit("guard", "alert", seed=2)
    closer = threading.Thread(target=gen.close)
    closer.start()
    assert queued.result(timeout=30).fallback_reason == "cancelled"
    gate.set()
    closer.join(timeout=30)
    assert first.done()


@pytest.fixture(scope="module")
def bundle_zip(tiny_model_dir, tmp_path_factory):
    from mobile_export.bundle import export_bundle

    return export_bundle(tiny_model_dir, tmp_path_factory.mktemp("bundle") / "flash", target="x86",
                         zip_output=True).path


def test_a_mobile_bundle_loads_like_a_model_directory(tiny_model_dir, bundle_zip):
    gen = LineGenerator.load(bundle_zip, min_mean_logprob=None)
    ref = fresh(tiny_model_dir)
    assert gen.catalog() == ref.catalog() and gen.banned_words == ref.banned_words
    line = gen.generate("guard", "patrol", seed=0, context={"player": "Aria"})  # (seed 3: a refused draw)
    assert isinstance(line, Line) and not line.fallback and line.tokens


def test_a_zipped_bundles_prefixes_stay_warm_across_restarts(bundle_zip, tmp_path):
    first = LineGenerator.load(bundle_zip, cache_dir=tmp_path / "kv")
    first.generate("child", "idle", seed=1)
    again = LineGenerator.load(bundle_zip, cache_dir=tmp_path / "kv")  # extracted afresh
    assert again.generate("child", "idle", seed=1).prefix_cache_hit


def test_a_damaged_bundle_raises_naming_it(bundle_zip, tmp_path):
    bad = tmp_path / "bad.zip"
    bad.write_bytes(bundle_zip.read_bytes()[:-200])
    with pytest.raises(ModelLoadError, match=r"bad\.zip"):
        LineGenerator.load(bad)
    with pytest.raises(ModelLoadError, match="no such model directory or bundle"):
        LineGenerator.load(tmp_path / "nowhere")


def test_a_stray_byte_between_letters_keeps_two_words_apart():
    from runtime.client.constraints import without_broken_bytes

    # the masks read a byte that decodes to no character as a word's end: "b", a stray byte, "us"
    # are two words, so the text must not join them into a banned "bus"
    assert without_broken_bytes("these b\ufffdus back") == "these b us back"
    assert without_broken_bytes("Halt!\ufffd Who\ufffd") == "Halt! Who"
    assert without_broken_bytes("caf\ufffd\ufffd") == "caf"
