"""The byte-level BPE tokenizer: lossless text, prompt layout, errors, JSON."""

from __future__ import annotations

import json
import re
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.factory.linebook import LineBook, load_line_book
from runtime.tokenizer import (
    MAX_VOCAB,
    Tokenizer,
    control_tokens,
    pretokenize,
    train_tokenizer,
)

CATALOG = {
    "archetypes": ["guard", "sailor"],
    "persona_traits": ["gruff", "kind", "shy"],
    "states": ["alert", "idle"],
    "intents": ["greet", "trade"],
    "context": {"time_of_day": ["day", "night"], "weather": ["clear", "rain"]},
    "slots": ["player", "location", "item"],
}
CORPUS = [
    "Halt! Who goes there, {player}?",
    "Nothing doing today, matey.",
    "The rain won't let up, citizen.",
    "Who goes there? Show yourself!",
    "Buying {item}? Not while I'm on watch.",
] * 20


@pytest.fixture(scope="module")
def small() -> Tokenizer:
    return train_tokenizer(CORPUS, CATALOG, vocab_size=400)


@pytest.fixture(scope="module")
def book() -> LineBook:
    return load_line_book()


@pytest.fixture(scope="module")
def full(book: LineBook) -> Tokenizer:
    return train_tokenizer([e.text for e in book.split().train], book.catalog())


def test_full_tokenizer_has_the_target_vocabulary(full: Tokenizer, book: LineBook) -> None:
    assert full.vocab_size == 2048
    assert full.n_control == len(control_tokens(book.catalog()))
    assert full.byte_offset == full.n_control
    assert (full.pad_id, full.bos_id, full.eos_id, full.line_id) == (0, 1, 2, 3)


def test_every_book_line_round_trips(full: Tokenizer, book: LineBook) -> None:
    for e in book.examples()[::7]:
        assert full.decode(full.encode(e.text)) == e.text


def test_book_lines_compress_well(full: Tokenizer, book: LineBook) -> None:
    sample = book.examples()[::50]
    ratio = sum(len(full.encode(e.text)) for e in sample) / sum(len(e.text) for e in sample)
    assert ratio < 0.3  # about one token per word, punctuation apart


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_unicode_round_trips_through_byte_fallback(small: Tokenizer, text: str) -> None:
    ids = small.encode(text)
    assert all(small.n_control <= i < small.vocab_size or i in (4, 5, 6) for i in ids)
    assert small.decode(ids) == text


def test_slot_markers_are_single_tokens(small: Tokenizer) -> None:
    ids = small.encode("Hello, {player}! Take the {item} to {location}.")
    for slot in ("player", "item", "location"):
        assert ids.count(small.id_of(f"<slot:{slot}>")) == 1
    assert small.decode([small.id_of("<slot:player>")]) == "{player}"
    # unknown markers are plain text
    ids = small.encode("{name}")
    assert all(i >= small.n_control for i in ids)
    assert small.decode(ids) == "{name}"


def test_decode_drops_control_tokens_and_rejects_bad_ids(small: Tokenizer) -> None:
    prompt, _ = small.encode_prompt("guard", ["gruff"], "alert", "greet", {"weather": "rain"})
    line = small.encode("Halt!")
    assert small.decode([*prompt, *line, small.eos_id, small.pad_id]) == "Halt!"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        small.decode([small.vocab_size])


def test_pretokenizer_splits_words_punctuation_and_spaces() -> None:
    assert pretokenize("Who goes there?  I'm here!") == [
        "Who",
        " goes",
        " there",
        "?",
        " ",
        " I",
        "'m",
        " here",
        "!",
    ]
    assert pretokenize("café 42") == ["caf", "é", " 42"]
    assert "".join(pretokenize("a\n\n b\t")) == "a\n\n b\t"


def test_training_is_deterministic_and_merges_most_frequent_first() -> None:
    a = train_tokenizer(CORPUS, CATALOG, vocab_size=350)
    b = train_tokenizer(list(CORPUS), CATALOG, vocab_size=350)
    assert a.merges == b.merges
    assert a.vocab_size <= 350
    # the first merge is the most frequent adjacent byte pair within chunks (slots cut out),
    # ties to the smaller ids
    counts: Counter[tuple[int, int]] = Counter()
    for text in CORPUS:
        for part in re.split(r"\{(?:player|location|item)\}", text):
            for chunk in pretokenize(part):
                raw = chunk.encode()
                counts.update(pairwise(raw))
    best = max(counts, key=lambda p: (counts[p], -p[0], -p[1]))
    assert a.merges[0] == (a.byte_offset + best[0], a.byte_offset + best[1])


def test_training_stops_when_no_pair_repeats() -> None:
    tok = train_tokenizer(["ab"], CATALOG, vocab_size=1000)
    assert tok.merges == []
    assert tok.vocab_size == len(control_tokens(CATALOG)) + 256


def test_vocabulary_limits_are_enforced() -> None:
    with pytest.raises(ValueError, match="exceeds the maximum"):
        train_tokenizer(CORPUS, CATALOG, vocab_size=MAX_VOCAB + 1)
    with pytest.raises(ValueError, match="below controls"):
        train_tokenizer(CORPUS, CATALOG, vocab_size=100)


def test_prompt_layout_and_cacheable_prefix(small: Tokenizer) -> None:
    ids, prefix_len = small.encode_prompt(
        "sailor",
        ["shy", "gruff"],
        "alert",
        "trade",
        [("weather", "rain"), ("time_of_day", "night")],
    )
    expected = [
        small.bos_id,
        small.id_of("<arch:sailor>"),
        small.id_of("<persona:gruff>"),
        small.id_of("<persona:shy>"),
        small.id_of("<state:alert>"),
        small.id_of("<intent:trade>"),
        small.id_of("<ctx:time_of_day=night>"),
        small.id_of("<ctx:weather=rain>"),
        small.line_id,
    ]
    assert ids == expected
    assert prefix_len == 5
    other, other_prefix = small.encode_prompt("sailor", ("gruff", "shy"), "alert", "greet", {})
    assert other[:other_prefix] == ids[:prefix_len]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"archetype": "sailer"}, "unknown archetype 'sailer'; known: sailor, guard"),
        ({"state": "alret"}, "unknown state 'alret'; known: alert, idle"),
        ({"intent": "gret"}, "unknown intent 'gret'; known: greet, trade"),
        ({"persona": ["shyy"]}, "unknown persona trait 'shyy'; known: shy"),
        (
            {"context": {"wether": "rain"}},
            "unknown context slot 'wether'; known: weather, time_of_day",
        ),
        (
            {"context": {"weather": "rainy"}},
            "unknown value for context slot 'weather' 'rainy'; known: rain, clear",
        ),
    ],
)
def test_unknown_prompt_values_list_known_values_closest_first(
    small: Tokenizer, kwargs: dict, message: str
) -> None:
    args = {"archetype": "guard", "persona": [], "state": "idle", "intent": "greet", "context": {}}
    args.update(kwargs)
    with pytest.raises(ValueError) as info:
        small.encode_prompt(**args)
    assert str(info.value).startswith(message)


def test_conflicting_context_values_are_rejected(small: Tokenizer) -> None:
    with pytest.raises(ValueError, match="given twice"):
        small.encode_prompt(
            "guard", [], "idle", "greet", [("weather", "rain"), ("weather", "clear")]
        )


def test_save_and_load_round_trip(small: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    small.save(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["format"] == "flashnpc-bpe"
    assert data["vocab_size"] == small.vocab_size == len(data["tokens"])
    assert data["tokens"][small.byte_offset + ord("A")] == "A"
    assert data["tokens"][small.byte_offset + ord(" ")] == "Ġ"
    loaded = Tokenizer.load(tmp_path)  # a model directory works too
    assert loaded.merges == small.merges
    assert loaded.encode("Halt! Who goes there?") == small.encode("Halt! Who goes there?")
    assert loaded.encode_prompt("guard", [], "idle", "greet", {}) == small.encode_prompt(
        "guard", [], "idle", "greet", {}
    )


def test_load_rejects_foreign_or_inconsistent_json(small: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": "other", "version": 1}), encoding="utf-8")
    with pytest.raises(ValueError, match="not a flashnpc-bpe v1 tokenizer"):
        Tokenizer.load(path)
    data = small.to_json()
    data["merges"] = [[small.vocab_size + 5, small.byte_offset]]
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match="refers to an id"):
        Tokenizer.load(path)


def _pretokenize_by_hand(text: str) -> list[str]:
    """docs/tokenizer.md's procedure, written without regular expressions."""
    ws = set(" \t\n\r\f\v")

    def kind(ch: str) -> str:
        if ch in ws:
            return "ws"
        if ch.isascii() and ch.isalpha():
            return "letter"
        if ch.isascii() and ch.isdigit():
            return "digit"
        return "other"

    chunks, i, n = [], 0, len(text)
    while i < n:
        if text[i] == "'":
            suffix = next(
                (s for s in ("s", "t", "re", "ve", "m", "ll", "d") if text.startswith(s, i + 1)),
                None,
            )
            if suffix is not None:
                chunks.append(text[i : i + 1 + len(suffix)])
                i += 1 + len(suffix)
                continue
        start = i + 1 if text[i] == " " and i + 1 < n and kind(text[i + 1]) != "ws" else i
        k = kind(text[start])
        if k != "ws":
            j = start
            while j < n and kind(text[j]) == k:
                j += 1
            chunks.append(text[i:j])
            i = j
            continue
        j = i
        while j < n and kind(text[j]) == "ws":
            j += 1
        end = j if j == n or j - i == 1 else j - 1
        chunks.append(text[i:end])
        i = end
    return chunks


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list(" \t\n'sdtmlrevAbz09!?,é\u00a0\u3000x")), max_size=30))
def test_documented_pretokenize_procedure_matches_the_pattern(text: str) -> None:
    assert _pretokenize_by_hand(text) == pretokenize(text)


def test_every_book_condition_encodes_as_a_prompt(full: Tokenizer, book: LineBook) -> None:
    for e in book.examples()[::211]:
        ids, prefix_len = full.encode_prompt(e.archetype, e.persona, e.state, e.intent, e.context)
        assert prefix_len == 3 + len(e.persona)
        assert len(ids) == prefix_len + 1 + len(e.context) + 1
        assert ids[-1] == full.line_id
        assert all(full.is_control(i) for i in ids)
