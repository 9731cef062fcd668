"""The pipelined decode loop (``LineGenerator(pipelined=True)``): the next position's masks are
made on a mask thread while the model runs, with exactly the lines of the serial loop, errors
surfacing as before and no thread outliving its generator."""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from runtime.client.constraints import WordState
from runtime.client.generator import LineGenerator, LineRequest


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[LineGenerator, LineGenerator]]:
    piped, serial = LineGenerator.load(pipelined=True), LineGenerator.load(pipelined=False)
    yield piped, serial
    piped.close()
    serial.close()


def _requests(gen: LineGenerator, n: int, seed: int) -> list[LineRequest]:
    """Requests of mixed shapes: forced 24-token lines (the redraw path), default budgets,
    greedy ones, stop strings and a free-text slot."""
    cat = gen.catalog()
    rng = np.random.default_rng(seed)
    out = []
    for j in range(n):
        persona = sorted(rng.choice(cat["persona_traits"], size=int(rng.integers(0, 3)), replace=False).tolist())
        slots = rng.choice(list(cat["context"]), size=int(rng.integers(0, 3)), replace=False)
        ctx = {s: str(rng.choice(cat["context"][s])) for s in slots}
        if j % 4 == 1:
            ctx["player"] = "Ada"
        forced = j % 2 == 0
        out.append(LineRequest(str(rng.choice(cat["archetypes"])), str(rng.choice(cat["states"])), persona=persona,
                               intent=str(rng.choice(cat["intents"])), context=ctx, seed=int(rng.integers(2**31)),
                               max_tokens=24 if forced else 40, min_tokens=24 if forced else 0,
                               temperature=0.0 if j % 5 == 3 else None, stop=(".",) if j % 6 == 5 else (),
                               npc_id=("pipelined-test", seed, j)))
    return out


def _key(line: Any) -> tuple[Any, ...]:
    return line.text, line.tokens, line.attempts, line.finish_reason, line.fallback, line.fallback_reason


def test_pipelined_and_serial_loops_write_the_same_lines(engines: tuple[LineGenerator, LineGenerator]) -> None:
    piped, serial = engines
    reqs = _requests(piped, 24, seed=5)
    got = [piped.generate_request(r) for r in reqs]
    want = [serial.generate_request(r) for r in reqs]
    assert [_key(g) for g in got] == [_key(w) for w in want]
    assert any(g.attempts > 1 for g in got), "no redraw exercised"
    assert {g.finish_reason for g in got} >= {"length", "eos"}


def test_pipelined_batches_and_streams_match_the_serial_loop(engines: tuple[LineGenerator, LineGenerator]) -> None:
    piped, serial = engines
    reqs = [replace(r, npc_id=("batch", *r.npc_id)) for r in _requests(piped, 8, seed=6)]
    assert [_key(x) for x in piped.generate_batch(reqs)] == [_key(x) for x in serial.generate_batch(reqs)]
    r = reqs[0]
    kw = dict(persona=r.persona, intent=r.intent, context=r.context, seed=r.seed, max_tokens=r.max_tokens,
              min_tokens=r.min_tokens, npc_id=("stream", 1))
    pieces = [list(gen.generate_stream(r.npc, r.state, **kw)) for gen in (piped, serial)]
    assert pieces[0] == pieces[1] and pieces[0]


def test_prepared_parts_give_the_row_masked_row_makes_itself(engines: tuple[LineGenerator, LineGenerator]) -> None:
    piped, _ = engines
    mask, tok = piped.mask, piped.tokenizer
    req = _requests(piped, 1, seed=7)[0]
    ban = mask.banned_bits(req.npc, req.persona or (), {k: v for k, v in (req.context or {}).items()
                                                        if k != "player"})
    rng = np.random.default_rng(0)
    state, checked = WordState(), 0
    for t in tok.encode("Well met, traveller. The roads are quiet tonight, aren't they?"):
        for last in (False, True):
            raw = rng.normal(0, 3, size=mask.vocab_size).astype(np.float32)
            parts = mask.prepare(state, last=last, banned=ban)
            row_a, veto_a = mask.masked_row(raw, state, last=last, banned=ban, parts=parts)
            row_b, veto_b = mask.masked_row(raw, state, last=last, banned=ban)
            assert row_a.tobytes() == row_b.tobytes() and veto_a == veto_b
            checked += 1
        state = mask.step(state, t)
    assert checked >= 20
    with pytest.raises(ValueError, match="mask parts made for"):
        mask.masked_row(raw, state, last=False, banned=ban, parts=mask.prepare(WordState(), banned=ban))


def test_an_error_on_the_mask_thread_becomes_a_model_error_fallback() -> None:
    gen = LineGenerator.load(pipelined=True)
    inner = gen.mask.prepare

    def prepare(*args: Any, **kw: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("mask thread failed")
        return inner(*args, **kw)

    gen.mask.prepare = prepare  # type: ignore[method-assign]
    try:
        line = gen.generate("guard", "patrol", seed=3, max_tokens=12, min_tokens=12)
        assert line.fallback and line.fallback_reason == "model_error"
    finally:
        gen.close()


def test_a_model_error_waits_for_the_mask_thread_before_the_fallback() -> None:
    gen = LineGenerator.load(pipelined=True)
    assert gen.model is not None
    gen.generate("guard", "patrol", seed=2, max_tokens=2)  # the prefix cached: a prefill is one step
    step, inner = gen.model.step, gen.mask.prepare
    calls, jobs, order, logged = [0], [0], [], threading.Event()

    def failing_step(*args: Any, **kw: Any) -> Any:
        calls[0] += 1
        if calls[0] == 4:  # the prefill, then decode steps: the third one fails
            raise RuntimeError("model failed")
        return step(*args, **kw)

    def prepare(*args: Any, **kw: Any) -> Any:
        out = inner(*args, **kw)
        if threading.current_thread() is not threading.main_thread():
            jobs[0] += 1
            if jobs[0] == 3:  # the masks made while the failing step runs: held until the error
                logged.wait(0.5)  # is logged (which must come after this job: 0.5 s here, no wait else)
                order.append("job")
        return out

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("model error"):
                order.append("logged")
                logged.set()

    seen = Seen()
    logging.getLogger("flashnpc.runtime").addHandler(seen)
    gen.model.step = failing_step  # type: ignore[method-assign]
    gen.mask.prepare = prepare  # type: ignore[method-assign]
    try:
        line = gen.generate("guard", "patrol", seed=3, max_tokens=12, min_tokens=12)
        assert line.fallback and line.fallback_reason == "model_error"
        assert order == ["job", "logged"]  # the failed step's job had finished before the error went on
    finally:
        logging.getLogger("flashnpc.runtime").removeHandler(seen)
        gen.close()


def _mask_threads(gen: LineGenerator) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"flashnpc-{gen.name}-masks")]


def test_close_stops_the_mask_threads_and_a_later_line_starts_them_again() -> None:
    gen = LineGenerator.load(pipelined=True, name="pipeclose")
    serial = LineGenerator.load(pipelined=False, name="pipeclose-serial")
    req = _requests(gen, 1, seed=8)[0]
    first = gen.generate_request(req)
    threads = _mask_threads(gen)
    assert threads and _mask_threads(serial) == []
    gen.close()
    assert not any(t.is_alive() for t in threads)
    again = gen.generate_request(replace(req, npc_id=("again",)))
    assert _key(again) == _key(first) == _key(serial.generate_request(req))
    gen.close()
    serial.close()


def test_close_during_a_line_finishes_it_on_the_calling_thread() -> None:
    gen = LineGenerator.load(pipelined=True, name="pipemid")
    serial = LineGenerator.load(pipelined=False)
    assert gen.model is not None
    step, calls = gen.model.step, [0]

    def closing_step(*args: Any, **kw: Any) -> Any:
        calls[0] += 1
        if calls[0] == 3:
            gen.close()  # the next position's masks cannot go to the pool any more
        return step(*args, **kw)

    gen.model.step = closing_step  # type: ignore[method-assign]
    req = _requests(gen, 1, seed=9)[0]
    assert _key(gen.generate_request(req)) == _key(serial.generate_request(req))
    assert calls[0] > 4
    gen.close()  # (a redraw after the first close started the pool again)
    assert _mask_threads(gen) == []
    serial.close()


def test_a_collected_generator_leaves_no_mask_thread() -> None:
    gen = LineGenerator.load(pipelined=True, name="pipegc")
    gen.generate("guard", "patrol", seed=1, max_tokens=6)
    threads = _mask_threads(gen)
    assert threads
    del gen
    gc.collect()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)


# ------------------------------------------------------------------ load(freeze_gc=True)


def test_freeze_gc_takes_the_loaded_engine_out_of_full_collections() -> None:
    gc.unfreeze()
    try:
        gen = LineGenerator.load(freeze_gc=True, pipelined=False)
        frozen = gc.get_freeze_count()
        assert frozen > 10_000  # the engine's tables among them
        tracked = {id(o) for o in gc.get_objects()}
        assert id(gen.mask._plans) not in tracked and id(gen) not in tracked
        line = gen.generate("guard", "patrol", seed=4, max_tokens=8)
        assert line.text and gc.get_freeze_count() <= frozen  # (what the line made is not frozen)
    finally:
        gc.unfreeze()
