"""The writer measures (runtime.factory.writer_eval): on a hand-made stand-in book whose figures can be
worked out by hand, and at small N on the real line book with the shipped model."""

from __future__ import annotations

import pytest

from runtime.client.onnx_model import FlashOnnx
from runtime.factory.evaluate import EvalConfig, Sampler
from runtime.factory.linebook import load_line_book
from runtime.factory.state_classifier import NgramClassifier
from runtime.factory.writer_eval import (
    SHAPES,
    SIDES,
    WRITER_THRESHOLDS,
    LineJudge,
    check,
    draw_requests,
    example_request,
    format_writer_table,
    measure_writer,
    pair_conditions,
    persona_pool,
    prompt_shape,
)
from tests.runtime.factory.standin_book import StandinBook, StandinSampler, standin_line

GUARD = ("guard", ("gruff",), "alert", "greet", (("time_of_day", "night"), ("weather", "rain")))


def test_prompt_shapes_count_traits_and_context_slots():
    assert prompt_shape(("gruff",), [1, 2, 3, 4], 4) == "full"
    assert prompt_shape(("gruff", "kind"), [1, 2, 3, 4], 4) == "full"
    assert prompt_shape((), [1, 2, 3, 4], 4) == "no_persona"
    assert prompt_shape(("gruff",), [], 4) == "ctx0"
    assert prompt_shape(("gruff",), [1], 4) == "ctx1"
    assert prompt_shape(("gruff", "kind"), [1, 2, 3], 4) == "ctx3"
    assert prompt_shape(("gruff",), [1, 2], 4) is None
    assert prompt_shape((), [], 4) is None


def test_judge_finds_nonwords_glitches_contradictions_and_other_voices():
    judge = LineJudge(StandinBook())
    clean = judge.verdict(GUARD, standin_line(GUARD))
    assert clean.fluent and clean.problems() == []
    assert clean.persona_voiced is True and clean.context_voiced is True

    bad = judge.verdict(GUARD, "Halt there,, matey! Sunny, {player} cold glorp.")
    assert bad.nonwords == ["glorp"]
    assert bad.glitches == ["double_punct"]
    # sunny is another value of a requested slot; cold is another weather than the rain asked
    assert bad.contradictions == ["context:time_of_day=day", "context:weather=snow"]
    assert bad.other_archetypes == ["archetype:sailor"]
    assert bad.persona_voiced is False and bad.context_voiced is False
    assert not bad.fluent and len(bad.problems()) == 5


def test_judge_leaves_unrequested_slots_and_absent_persona_out():
    judge = LineJudge(StandinBook())
    request = ("guard", (), "alert", "greet", (("weather", "rain"),))
    verdict = judge.verdict(request, "Halt there, citizen! It is dark and wet.")
    assert verdict.contradictions == []  # time of day was not asked: dark contradicts nothing
    assert verdict.persona_voiced is None and verdict.context_voiced is True
    no_context = judge.verdict(("guard", ("kind",), "alert", "greet", ()), "Halt there, dear.")
    assert no_context.context_voiced is None and no_context.persona_voiced is True


def test_drawn_requests_have_the_shape_asked_and_are_seeded():
    import numpy as np

    book = StandinBook()
    split = book.split()
    conditions = pair_conditions(book, split, "seen")
    assert ("sailor", "rest", "greet") not in conditions and ("guard", "rest", "trade") in conditions
    assert pair_conditions(book, split, "heldout") == [("sailor", "rest", "greet"), ("sailor", "rest", "trade")]
    personas = persona_pool(book)
    for shape in SHAPES:
        a = draw_requests(book, conditions, shape, 30, np.random.default_rng(5), personas)
        b = draw_requests(book, conditions, shape, 30, np.random.default_rng(5), personas)
        assert a == b
        assert {prompt_shape(r[1], r[4], 4) for r in a} == {shape}
        assert {(r[0], r[2], r[3]) for r in a} == set(conditions)  # every condition, in turn
        for *_, context in a:
            assert list(context) == sorted(context)
    ctx1 = draw_requests(book, conditions, "ctx1", 40, np.random.default_rng(1), personas)
    assert len({r[4][0][0] for r in ctx1}) > 1  # the one slot varies


def test_check_applies_max_min_held_out_and_book_bounds():
    assert check("nonword_rate", "seen", 0.0, None) is True
    assert check("nonword_rate", "seen", 0.001, None) is False
    assert check("glitch_rate", "heldout", 0.003, None) is True
    assert check("archetype_accuracy", "seen", 0.40, None) is False
    assert check("archetype_accuracy", "heldout", 0.40, None) is True
    assert check("state_fidelity", "heldout", 0.91, None) is True
    assert check("persona_voiced", "seen", 0.20, 0.10) is True
    assert check("persona_voiced", "seen", 0.20, 0.25) is False  # below the book's own rate
    assert check("persona_voiced", "seen", 0.14, 0.05) is False  # below 15%
    assert check("persona_voiced", "seen", None, 0.2) is None  # not applicable
    assert check("novelty", "seen", 0.1, None) is None  # no target
    assert set(WRITER_THRESHOLDS) >= {"nonword_rate", "distinct2", "intent_accuracy"}


def _standin_classifiers(book):
    split = book.split()
    texts = [e.text for e in split.train]
    return NgramClassifier.fit_many(
        texts, {k: [getattr(e, k) for e in split.train] for k in ("archetype", "intent", "state")},
        min_count=1, seed=0)


def test_measure_writer_on_the_standin_gives_the_figures_worked_out_by_hand():
    book = StandinBook()
    cfg = EvalConfig(writer_samples=30, writer_diversity=2, diversity_samples=6, book_reference=50, seed=2)
    sampler = StandinSampler()
    report = measure_writer(book, book.split(), sampler, _standin_classifiers(book), cfg)
    assert set(report["cells"]) == set(SHAPES)
    for shape in SHAPES:
        for side in SIDES:
            cell = report["cells"][shape][side]
            model, ref = cell["model"], cell["book"]
            assert cell["lines"] == 30
            assert model["nonword_rate"] == 0 and model["other_archetype_rate"] == 0
            assert model["contradiction_rate"] in (0, None)
            # every third row has a doubled comma: 10 of 30 (the seeds differ per cell)
            assert model["glitch_rate"] == pytest.approx(1 / 3)
            assert model["glitch"]["double_punct"] == pytest.approx(1 / 3)
            assert cell["checks"]["glitch_rate"] is False and cell["checks"]["nonword_rate"] is True
            assert model["persona_voiced"] == (None if shape == "no_persona" else 1.0)
            assert model["context_voiced"] == (None if shape == "ctx0" else 1.0)
            assert model["novelty"] >= 1 / 3  # the glitched lines at least are new
            assert model["intent_accuracy"] == 1.0
            # the book's one line per prompt repeats no word pair; the six samples repeat all but a glitch's
            assert ref["distinct2"] == 1.0 and model["distinct2"] < 0.5
            if ref["glitch_rate"] is not None:  # the book has lines of this shape and side
                assert ref["glitch_rate"] == 0 and ref["nonword_rate"] == 0
    assert report["cells"]["ctx0"]["seen"]["checks"]["context_voiced"] is None
    assert report["checks"]["full.seen.glitch_rate"] is False and not report["passed"]
    assert "full.seen.glitch_rate" in report["failed"]
    assert report["examples"]["glitch"] and not report["examples"]["nonword"]
    assert sampler.calls == 10 * (1 + 2)  # one batch per cell, one per diversity prompt
    again = measure_writer(book, book.split(), StandinSampler(), _standin_classifiers(book), cfg)
    assert again == report


class _FallingBackSampler(StandinSampler):
    """The stand-in's lines, every fifth of a call marked as one the engine would replace."""

    def sample(self, requests, seed):
        lines = super().sample(requests, seed)
        self.last_fallbacks = [k % 5 == 0 for k in range(len(lines))]
        return lines


def test_measure_writer_reports_the_lines_the_engine_would_serve_as_fallbacks():
    book = StandinBook()
    cfg = EvalConfig(writer_samples=30, writer_diversity=1, diversity_samples=4, book_reference=20, seed=1)
    report = measure_writer(book, book.split(), _FallingBackSampler(), _standin_classifiers(book), cfg)
    plain = measure_writer(book, book.split(), StandinSampler(), _standin_classifiers(book), cfg)
    for shape in SHAPES:
        for side in SIDES:
            assert report["cells"][shape][side]["model"]["fallback_rate"] == pytest.approx(6 / 30)
            assert plain["cells"][shape][side]["model"]["fallback_rate"] == 0.0
            assert report["cells"][shape][side]["checks"].get("fallback_rate") is None  # reported, no target
    assert "served as a fallback" in format_writer_table(report)


def test_writer_table_shows_every_shape_figure_and_target():
    book = StandinBook()
    cfg = EvalConfig(writer_samples=12, writer_diversity=1, diversity_samples=4, book_reference=20)
    report = measure_writer(book, book.split(), StandinSampler(), _standin_classifiers(book), cfg)
    table = format_writer_table(report)
    for needle in ("seen pairs", "heldout pairs", *SHAPES, "non-word lines", "glitch lines",
                   "context contradictions", "another archetype's voice", "persona voiced",
                   "context voiced", "archetype classifier", "intent classifier", "state fidelity",
                   "distinct-2", "memorised", "<= 0.3%", ">= 15% & book", ">= 30%", "33.3 (0.0) !"):
        assert needle in table, needle


# ---------------------------------------------------------------- the real book and model


@pytest.fixture(scope="module")
def real_book():
    return load_line_book()


def test_the_line_books_own_lines_are_clean_by_every_fluency_measure(real_book):
    judge = LineJudge(real_book)
    dirty = []
    for e in real_book.examples():
        problems = judge.verdict(example_request(e), e.text).problems()
        if problems:
            dirty.append((e.text, problems))
    assert not dirty, dirty[:10]


def test_measure_writer_with_the_shipped_model_is_seeded_and_complete(real_book):
    split = real_book.split()
    train = split.train[::10]  # a slice: this test checks the plumbing, not the classifiers
    classifiers = NgramClassifier.fit_many(
        [e.text for e in train], {k: [getattr(e, k) for e in train] for k in ("archetype", "intent", "state")},
        seed=0)
    cfg = EvalConfig(writer_samples=14, writer_diversity=1, diversity_samples=8, book_reference=200, seed=3)
    sampler = Sampler(FlashOnnx.load(file="model.int4.onnx"), cfg, real_book)
    first = measure_writer(real_book, split, sampler, classifiers, cfg)
    second = measure_writer(real_book, split, sampler, classifiers, cfg)
    assert first == second
    n_slots = len(real_book.context)
    for shape in SHAPES:
        for side in SIDES:
            cell = first["cells"][shape][side]
            assert cell["lines"] == 14 and cell["book_lines"] > 0
            for name, value in cell["model"].items():
                if isinstance(value, float):
                    assert 0.0 <= value <= 1.0, (shape, side, name, value)
            assert set(cell["checks"]) == set(WRITER_THRESHOLDS)
            assert cell["book"]["nonword_rate"] == 0 and cell["book"]["contradiction_rate"] in (0, None)
    for kind, found in first["examples"].items():
        for ex in found:
            assert ex["found"] and example_shape_of(ex, n_slots) == ex["shape"], kind


def example_shape_of(ex, n_slots):
    return prompt_shape(ex["persona"], list(ex["context"].items()), n_slots)

