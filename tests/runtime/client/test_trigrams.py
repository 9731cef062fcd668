"""The book's word trigrams: how a line is read, the Bloom filter that ships, and the engines
that draw a line again when it strings three words together where the book never does."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.client.constraints import Constraints, read_constraints, settled_text
from runtime.client.generator import LineGenerator, LineRequest
from runtime.client.trigrams import (
    END,
    START,
    TrigramReader,
    TrigramTable,
    line_trigrams,
    tokens_through,
)
from runtime.factory.export import book_lines
from runtime.factory.linebook import load_line_book
from runtime.paths import DEFAULT_MODEL_DIR


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return book_lines(load_line_book())


@pytest.fixture(scope="module")
def shipped() -> LineGenerator:
    return LineGenerator.load(warmup=False)


def test_a_line_is_read_as_sentences_each_from_the_start_token():
    assert [t for t, _ in line_trigrams("Halt! Who goes there, {player}?")] == [
        (START, "halt", "!"), (START, "who", "goes"), ("who", "goes", "there"), ("goes", "there", ","),
        ("there", ",", "{player}"), (",", "{player}", "?")]
    # an ellipsis ends a sentence whichever way it is written; hyphens and quotes are not tokens
    assert [t for t, _ in line_trigrams("Oh, er\u2026 F-fine.")] == [t for t, _ in line_trigrams("Oh, er... F-fine.")]
    assert (START, "f", "fine") in {t for t, _ in line_trigrams("Oh, er... F-fine.")}


def test_only_a_line_cut_mid_sentence_ends_in_the_end_token():
    assert [t for t, _ in line_trigrams("Get in close! Not in")][-1] == ("not", "in", END)
    assert all(END not in t for t, _ in line_trigrams("Get in close! Not now."))


def test_a_line_still_being_decoded_leaves_a_mark_at_its_end_unread():
    table = TrigramTable.from_texts(["Oh, er... Come closer."])
    reader = TrigramReader()
    assert table.first_unseen("Oh, er.", reader=reader, final=False) is None  # "." may still become "..."
    assert reader.read == 6
    assert table.first_unseen("Oh, er...", reader=reader, final=False) is None and reader.read == 6
    assert table.first_unseen("Oh, er... Come", reader=reader, final=False) is None
    assert table.first_unseen("Oh, er... Come", reader=reader, final=True)[0] == (START, "come", END)
    assert table.first_unseen("Oh, er.") == ((",", "er", "."), 6, 7)


def test_a_reader_fed_a_growing_line_reads_what_the_whole_line_holds(lines):
    rng = random.Random(2)
    for text in [*rng.sample(lines, 200), "Halt!? Who... goes there", "Hm", ""]:
        reader, got = TrigramReader(), []
        for cut in sorted({rng.randint(0, len(text)) for _ in range(6)}):
            got += list(reader.feed(settled_text(text[:cut])))  # complete words, as the engine feeds it
        got += list(reader.feed(text, final=True))
        assert [(t, e) for t, _c, e in got] == line_trigrams(text)


def test_first_unseen_says_where_the_line_is_cut():
    table = TrigramTable.from_texts(["Halt! Who goes there?"])
    text = "Halt! Who comes there?"
    tri, cut, end = table.first_unseen(text)
    assert tri == (START, "who", "comes") and text[:cut] == "Halt! Who" and text[:end] == "Halt! Who comes"


def test_every_trigram_of_the_book_passes_and_few_unseen_ones_do(lines):
    rng = random.Random(5)
    sample = rng.sample(lines, 4000)
    table = TrigramTable.from_texts(sample)
    assert all(table.first_unseen(t) is None for t in sample)  # a Bloom filter has no false negatives
    held = {t for text in sample for t, _ in line_trigrams(text)}
    words = sorted({w for t in held for w in t if w not in (START, END)})
    unseen = set()
    while len(unseen) < 5000:
        tri = (rng.choice(words), rng.choice(words), rng.choice(words))
        if tri not in held:
            unseen.add(tri)
    passed = sum(t in table for t in unseen) / len(unseen)
    assert 0.005 < table.false_positive_rate < 0.04
    assert passed < 2 * table.false_positive_rate + 0.005


def test_the_shipped_constraints_carry_the_trigrams_and_they_round_trip():
    cons = read_constraints(None)
    assert cons.trigrams is not None and cons.trigrams.n > 30_000
    assert cons.trigrams.false_positive_rate < 0.03
    again = Constraints.from_json(json.loads(json.dumps(cons.to_json())))
    assert again.trigrams == cons.trigrams


@pytest.mark.parametrize("bad, field", [
    ([], "trigrams must be an object"),
    ({"m": 64, "k": 6, "n": 0}, "trigrams.bits"),
    ({"m": "64", "k": 6, "n": 0, "bits": ""}, "trigrams.m"),
    ({"m": 64, "k": True, "n": 0, "bits": ""}, "trigrams.k"),
    ({"m": 64, "k": 6, "n": 0, "bits": "not base64!"}, "trigrams.bits is not base64"),
    ({"m": 64, "k": 6, "n": 0, "bits": "AAAA"}, "bits must be m / 8"),
    ({"m": 60, "k": 6, "n": 0, "bits": "AAAAAAAAAAA="}, "multiple of 8"),
    ({"m": 64, "k": 0, "n": 0, "bits": "AAAAAAAAAAA="}, "k must be"),
])
def test_a_malformed_table_is_refused_naming_the_field(bad, field):
    with pytest.raises((TypeError, ValueError), match=field):
        TrigramTable.from_json(bad)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=12),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
                        st.sampled_from(["m", "k", "n", "bits", "x"]), kids, max_size=5), max_leaves=12))
def test_hostile_json_is_refused_with_a_type_or_value_error(doc):
    try:
        table = TrigramTable.from_json(doc)
    except (TypeError, ValueError):
        return
    table.first_unseen("Halt! Who goes there?")  # a table that parses reads lines without failing


def test_a_fine_tune_table_holds_the_base_and_the_studio_lines():
    base = TrigramTable.from_texts(["Halt! Who goes there?"])
    tuned = base.with_texts(["Low water, and the mud stinks."])
    assert (tuned.m, tuned.k) == (base.m, base.k) and tuned.n > base.n
    assert tuned.first_unseen("Halt! Who goes there?") is None
    assert tuned.first_unseen("Low water, and the mud stinks.") is None
    assert base.first_unseen("Low water, and the mud stinks.") is not None


def test_tokens_through_counts_the_tokens_that_reach_an_offset(shipped):
    tok = shipped.tokenizer
    ids = tok.encode("Halt! Who goes there?")
    text = tok.decode(ids)
    for end in (1, 5, 9, len(text)):
        j = tokens_through(tok, ids, end)
        assert len(tok.decode(ids[:j])) >= end and len(tok.decode(ids[: j - 1])) < end


def _requests(gen: LineGenerator, n: int) -> list[LineRequest]:
    cat = gen.catalog()
    rng = random.Random(11)
    out = []
    for j in range(n):
        slots = rng.sample(sorted(cat["context"]), rng.randint(0, len(cat["context"])))
        out.append(LineRequest(rng.choice(cat["archetypes"]), rng.choice(cat["states"]),
                               persona=rng.sample(cat["persona_traits"], rng.randint(0, 1)),
                               intent=rng.choice(cat["intents"]),
                               context={s: rng.choice(cat["context"][s]) for s in slots}, seed=j, npc_id=j))
    return out


def test_the_engine_never_serves_a_line_with_a_trigram_the_book_never_says(shipped):
    table = shipped.trigrams
    assert table is not None
    served = [shipped.generate_request(r) for r in _requests(shipped, 40)]
    model = [line for line in served if not line.fallback]
    assert len(model) >= 35
    assert [line.raw_text for line in model if table.first_unseen(line.raw_text) is not None] == []


def _two_sentence_lines(gen: LineGenerator, lines: list[str]) -> Iterator[tuple[LineRequest, str, tuple[str, str, str]]]:
    """Requests whose line (without the trigram check) has two sentences, its first sentence,
    and the first trigram of its second, where the book has another way on after that first
    sentence (a book of whole lines may follow a sentence with one sentence only: without its
    trigram the line can only be drawn again from the start)."""
    plain = LineGenerator.load(warmup=False, trigrams=None)
    for req in _requests(gen, 60):
        line = plain.generate_request(req)
        spans = line_trigrams(line.raw_text)
        starts = [i for i, (t, _) in enumerate(spans) if t[0] == START]
        if not line.fallback and len(starts) >= 2 and line.attempts == 1:
            tri, _end = spans[starts[1]]
            first_sentence = line.raw_text[: spans[starts[1] - 1][1]]
            if any(t.startswith(first_sentence + " ") and tri not in {g for g, _ in line_trigrams(t)} for t in lines):
                yield req, first_sentence, tri


@pytest.fixture(scope="module")
def without_one(shipped, lines):
    """(request, its line's first sentence, the trigram opening its second sentence, an engine
    whose table is the book's lines that don't say that trigram)."""
    for req, first_sentence, tri in _two_sentence_lines(shipped, lines):
        table = TrigramTable.from_texts(t for t in lines if tri not in {g for g, _ in line_trigrams(t)})
        if tri not in table:  # the table is a Bloom filter: a false positive can keep it
            return req, first_sentence, tri, LineGenerator.load(warmup=False, trigrams=table)
    raise AssertionError("no two-sentence line with another way on among 60 requests")


def test_a_line_with_an_unseen_trigram_is_drawn_again_from_the_sentence_before_it(without_one):
    req, first_sentence, tri, gen = without_one
    line = gen.generate_request(req)
    assert line.attempts > 1
    if not line.fallback:
        assert line.raw_text.startswith(first_sentence)
        assert tri not in {g for g, _ in line_trigrams(line.raw_text)}
        assert gen.trigrams.first_unseen(line.raw_text) is None


def test_a_stream_goes_on_from_what_it_has_shown(without_one):
    req, first_sentence, tri, gen = without_one
    stream = gen.generate_stream(req.npc, req.state, persona=req.persona, intent=req.intent, context=req.context,
                                 seed=req.seed, npc_id=("stream", req.npc_id))
    pieces = list(stream)
    assert "".join(pieces) == stream.line.text
    assert stream.line.attempts > 1
    if stream.line.attempts <= gen.max_resamples and not stream.line.fallback:
        assert stream.line.raw_text.startswith(first_sentence)
        assert tri not in {g for g, _ in line_trigrams(stream.line.raw_text)}
        assert gen.trigrams.first_unseen(stream.line.raw_text) is None


def test_a_line_that_always_strings_unseen_trigrams_falls_back(shipped):
    gen = LineGenerator.load(warmup=False, trigrams=TrigramTable.from_texts(["Halt!"]))
    line = gen.generate("guard", "alert", intent="greet", seed=3)
    assert line.fallback and line.fallback_reason == "unusable" and line.attempts == gen.max_resamples + 1


def test_the_evaluation_samples_lines_as_the_engine_serves_them(shipped):
    from runtime.client.onnx_model import FlashOnnx
    from runtime.factory.evaluate import EvalConfig, Sampler

    model = FlashOnnx.load(DEFAULT_MODEL_DIR)
    sampler = Sampler(model, EvalConfig.fast(), load_line_book())
    assert sampler.trigrams is not None
    reqs = [(r.npc, tuple(r.persona or ()), r.state, r.intent, dict(r.context or {})) for r in _requests(shipped, 16)]
    texts = sampler.sample(reqs, seed=4)
    kept = [t for t, fell in zip(texts, sampler.last_fallbacks) if not fell]
    assert len(kept) >= 12
    assert [t for t in kept if sampler.trigrams.first_unseen(t) is not None] == []

