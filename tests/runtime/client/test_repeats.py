"""A line never says the same sentence twice (runtime.client.repeats): the rule, the book it must
never refuse, and the engine and evaluation drawing such a line again from the sentence before."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import runtime.client.generator as generator_module
import runtime.factory.evaluate as evaluate_module
from runtime.client.generator import LineGenerator, LineRequest
from runtime.client.repeats import MIN_WORDS, repeated_sentence, sentence_words
from runtime.factory.export import book_lines
from runtime.factory.linebook import load_line_book

# read blind as garbled, served by models v3.3 and v3.4 (docs/ratings/ab_v34_v33*.csv)
SERVED_TWICE = [
    ("Take care! Same spot, next lap, if you need me. Same spot, next lap, if you need me.",
     "Same spot, next lap, if you need me."),
    ("Well met, if you're what you seem. I doubt you are. Well met, if you're what you seem. I wonder if you are.",
     "Well met, if you're what you seem."),
]


@pytest.mark.parametrize(("line", "again"), SERVED_TWICE)
def test_a_sentence_said_twice_is_found_where_it_is_said_again(line, again):
    hit = repeated_sentence(line)
    assert hit is not None
    start, end = hit
    assert line[start:end] == again
    assert line.index(again) < start  # the second saying, not the first


def test_words_are_compared_without_case_punctuation_or_slot_braces():
    assert repeated_sentence("Go to {location} now, friend. go to location now friend!") is not None
    assert sentence_words("Don't, {player}!") == ("don't", "player")


@pytest.mark.parametrize("line", [
    "Run! Run! Run for it!",
    "Pinch, kick, and run! Pinch, kick, and run!",  # the book's chant: four words
    "Halt! Who goes there at this hour? Who goes there at this time?",
    "I see you there, thief. I see you there, thief",  # the last sentence is unfinished
])
def test_shouts_near_misses_and_an_unfinished_sentence_pass(line):
    assert repeated_sentence(line) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["Halt there, you rogue", "Who goes there at night", "Run", "Go on",
                                 "Mind the step, friend", "halt there you rogue"]), max_size=6),
       st.lists(st.sampled_from([".", "!", "?", "..."]), min_size=6, max_size=6))
def test_a_hit_is_exactly_a_long_sentence_whose_words_came_before(parts, marks):
    text = " ".join(p + m for p, m in zip(parts, marks))
    keys = [tuple(re.findall(r"[a-z]+", p.lower())) for p in parts]
    first_again = next((i for i, k in enumerate(keys) if len(k) >= MIN_WORDS and k in keys[:i]), None)
    hit = repeated_sentence(text)
    if first_again is None:
        assert hit is None
    else:
        assert hit is not None and sentence_words(text[hit[0]:hit[1]]) == keys[first_again]


def test_no_line_of_the_default_book_says_a_long_sentence_twice():
    lines = book_lines(load_line_book())
    assert len(lines) > 80_000  # book v5's whole lines and its fallbacks: 88,870
    assert [t for t in lines if repeated_sentence(t) is not None] == []


def second_sentence_is_a_repeat(text: str) -> tuple[int, int] | None:
    """A stricter rule for the tests below: any second sentence 'repeats' the first."""
    ends = [m.end() for m in re.finditer(r"(?:\.\.\.|[.!?]+)(?=\s|$)", text)]
    if len(ends) < 2:
        return None
    start = ends[0] + (len(text[ends[0]:]) - len(text[ends[0]:].lstrip()))
    return start, ends[1]


def one_sentence(text: str) -> bool:
    return second_sentence_is_a_repeat(text) is None


@pytest.fixture(scope="module")
def gen() -> LineGenerator:
    return LineGenerator.load(max_resamples=2, warmup=False)


def requests(gen: LineGenerator, n: int) -> list[LineRequest]:
    cat = gen.catalog()
    rng = np.random.default_rng(11)
    return [LineRequest(str(rng.choice(cat["archetypes"])), str(rng.choice(cat["states"])),
                        intent=str(rng.choice(cat["intents"])), seed=j, npc_id=("repeats", j))
            for j in range(n)]


def test_the_engine_draws_a_repeat_again_from_the_sentence_before_it(gen, monkeypatch):
    monkeypatch.setattr(generator_module, "repeated_sentence", second_sentence_is_a_repeat)
    resumed: list[tuple[Any, str]] = []
    original = gen._resumed_row

    def spy(prev: Any, keep: int, seed: Any) -> Any:
        resumed.append((prev.finish, gen.tokenizer.decode(prev.tokens[:keep])))
        return original(prev, keep, seed)

    monkeypatch.setattr(gen, "_resumed_row", spy)
    lines = [gen.generate_request(r) for r in requests(gen, 30)]
    assert resumed, "no line of 30 said a second sentence"
    for finish, kept in resumed:
        assert finish == "blocked" and one_sentence(kept) and kept.rstrip()[-1] in ".!?"
    served = [line for line in lines if not line.fallback]
    assert served and all(one_sentence(line.raw_text) for line in served)


def test_the_evaluation_draws_a_repeat_again_as_the_engine_does(gen, monkeypatch):
    from runtime.client.onnx_model import DEFAULT_MODEL_DIR, FlashOnnx
    from runtime.factory.evaluate import EvalConfig, Sampler

    monkeypatch.setattr(evaluate_module, "repeated_sentence", second_sentence_is_a_repeat)
    sampler = Sampler(FlashOnnx.load(DEFAULT_MODEL_DIR), EvalConfig.fast(), load_line_book())
    reqs = [(r.npc, (), r.state, r.intent, {}) for r in requests(gen, 24)]
    texts = sampler.sample(reqs, seed=5)
    kept = [t for t, fell in zip(texts, sampler.last_fallbacks) if not fell]
    assert kept, "every line of 24 fell back"
    assert all(one_sentence(t) for t in kept)
