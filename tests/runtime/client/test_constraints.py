"""Constraints: token-level banned words, slot filling, repeat memory, sampling checks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from runtime.client.constraints import (
    MID_LINE,
    BannedWordMask,
    RepeatMemory,
    WordState,
    check_sampling,
    fill_slots,
    read_constraints,
    unfilled_slots,
    usable,
)
from runtime.factory.linebook import book_constraints, load_line_book
from runtime.factory.text_metrics import banned_hits
from runtime.tokenizer import train_tokenizer

BANNED = ["car", "gun", "guns", "ok", "okay", "train station"]


@pytest.fixture(scope="module")
def tok():
    texts = ["The car and the cart, a gun or guns; okay? Ok. The train station, a station by the train.",
             "Careful with the cargo, the gunner is okay and the carts are ok.",
             "Halt, {player}! Who goes there? Fine weather for trading at {location}."] * 3
    return train_tokenizer(texts, load_line_book().catalog(), vocab_size=420)


@pytest.fixture(scope="module")
def mask(tok):
    return BannedWordMask(BANNED, tok)


def test_completing_a_banned_word_at_a_boundary_is_blocked(mask):
    assert mask.advance(MID_LINE, "the car ") is None
    assert mask.advance(MID_LINE, "the CAR,") is None
    assert mask.advance(MID_LINE, "my car2") is None
    assert mask.advance(MID_LINE, "a car", final=True) is None


def test_words_that_merely_start_like_a_banned_word_pass(mask):
    for text in ("the cart ", "careful ", "a gunner ", "cargo, ", "car's ", "oka ", "scar "):
        assert mask.advance(MID_LINE, text) is not None, text
    assert mask.advance(MID_LINE, "the car") is not None  # may still become "cart"


def test_banned_phrases_are_blocked_across_punctuation_but_not_split_by_words(mask):
    assert mask.advance(MID_LINE, "the train station.") is None
    assert mask.advance(MID_LINE, "the train, station!") is None
    assert mask.advance(MID_LINE, "the train by the station.") is not None
    assert mask.advance(MID_LINE, "a station, the train.") is not None


def test_after_a_pending_banned_word_only_letters_may_follow(mask, tok):
    state = mask.advance(MID_LINE, " car")
    blocked = mask.blocked(state)
    assert blocked[tok.eos_id]
    t_id = tok.encode("t")
    assert len(t_id) == 1 and not blocked[t_id[0]]
    comma = tok.encode(",")
    assert blocked[comma[0]]


def test_control_tokens_are_blocked_but_eos_and_slots_are_not(mask, tok):
    blocked = mask.blocked(MID_LINE)
    assert blocked[tok.bos_id] and blocked[tok.line_id] and blocked[tok.id_of("<arch:guard>")]
    assert not blocked[tok.eos_id] and not blocked[tok.id_of("<slot:player>")]


def test_tokens_with_ascii_control_characters_are_blocked(mask, tok):
    blocked = mask.blocked(MID_LINE)
    assert blocked[tok.byte_offset + ord("\n")] and blocked[tok.byte_offset + 0x07]
    assert not blocked[tok.byte_offset + ord("a")]


@pytest.mark.parametrize("seed", range(40))
def test_random_walks_through_the_mask_never_spell_a_banned_word(mask, tok, seed):
    """Pick among allowed tokens, biased towards banned spellings, and check the decoded text."""
    rng = np.random.default_rng(seed)
    lure = [i for w in ("car", " car", " gun", " guns", "ok", " ok", " okay", " train", " station", "un")
            for i in tok.encode(w)]
    state, ids, budget = WordState(), [], 30
    for n in range(budget):
        blocked = mask.blocked(state, last=n + 1 == budget)
        allowed = np.flatnonzero(~blocked)
        good_lures = [i for i in lure if not blocked[i]]
        nxt = int(rng.choice(good_lures)) if good_lures and rng.random() < 0.6 else int(rng.choice(allowed))
        if nxt == tok.eos_id:
            break
        ids.append(nxt)
        state = mask.step(state, nxt)
    text = tok.decode(ids)
    assert banned_hits(text, BANNED) == [], text


def test_the_unmasked_walk_does_spell_banned_words(tok):
    """The lure walk above, without the mask, does produce banned words (so the test can fail)."""
    hits = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        lure = [i for w in (" car", " gun", " ok", " train", " station") for i in tok.encode(w)]
        ids = [int(rng.choice(lure)) for _ in range(10)]
        hits += bool(banned_hits(tok.decode(ids), BANNED))
    assert hits > 30


def test_fill_slots_replaces_known_markers_only():
    assert fill_slots("Halt, {player}! At {location}?", {"player": "Aria"}) == "Halt, Aria! At {location}?"
    assert unfilled_slots("Halt, {player}! At {location}?") == {"player", "location"}


def test_repeat_memory_remembers_a_window_per_key():
    mem = RepeatMemory(size=2)
    mem.remember(("guard", "p1"), "Halt! Who goes there?")
    assert mem.said_recently(("guard", "p1"), "halt  who goes THERE")
    assert not mem.said_recently(("guard", "p2"), "Halt! Who goes there?")
    mem.remember(("guard", "p1"), "Second.")
    mem.remember(("guard", "p1"), "Third.")
    assert not mem.said_recently(("guard", "p1"), "Halt! Who goes there?")
    assert mem.recent(("guard", "p1")) == ["second", "third"]


def test_usable_rejects_empty_and_wordless_lines():
    assert usable("  ") == "empty"
    assert usable("!! ?? 12") == "no_words"
    assert usable("Halt!") is None


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_k=-1), "top_k"),
    (dict(max_tokens=0), "max_tokens"), (dict(min_tokens=5, max_tokens=4), "min_tokens"),
])
def test_out_of_range_sampling_parameters_raise(kwargs, match):
    args = dict(temperature=0.8, top_k=0, top_p=0.9, max_tokens=8, min_tokens=0) | kwargs
    with pytest.raises(ValueError, match=match):
        check_sampling(**args)


def test_constraints_come_from_the_line_book_or_a_constraints_file(tmp_path):
    cons = book_constraints()
    banned, rules = cons.banned_words, cons.slot_rules
    book = load_line_book()
    assert banned == book.banned_words and cons.vocabulary is None
    for arch, state, intent in [("guard", "working", "trade"), ("child", "flee", "ask_directions")]:
        assert rules.allowed(arch, state, intent) == book.allowed_slots(arch, state, intent)
    # a model directory without constraints.json: the shipped model's, as exported from the
    # book, without the vocabulary (no line book, no YAML in the client)
    assert read_constraints(tmp_path) == cons
    assert read_constraints().vocabulary is not None
    (tmp_path / "constraints.json").write_text(json.dumps({
        "banned_words": ["robot"], "slots": ["player"],
        "slot_rules": {"archetype": {"guard": ["player"]}, "state": {}, "intent": {}}}))
    cons = read_constraints(tmp_path)
    assert cons.banned_words == ["robot"] and cons.slot_rules.allowed("guard", "idle", "greet") == {"player"}
    (tmp_path / "constraints.json").write_text("{}")
    with pytest.raises(ValueError, match=r"constraints\.json: not a constraints file"):
        read_constraints(tmp_path)


def test_the_fast_mask_equals_the_token_by_token_reference(mask, tok):
    texts = ["", "the c", "the ca", "the car", "a gun", "the gu", "o", "ok", "the train", "the train, sta",
             "xyz", "the car'", "a trains", "the train by"]
    for text in texts:
        state = mask.advance(MID_LINE, text)
        assert state is not None, text
        for last in (False, True):
            fast, ref = mask.blocked(state, last=last), mask.blocked_exact(state, last=last)
            assert np.array_equal(fast, ref), (text, last, np.flatnonzero(fast != ref)[:10])


def test_a_slot_value_that_starts_a_sentence_is_capitalised():
    values = {"location": "the barracks", "item": "a sword"}
    assert fill_slots("{location} is that way. Past {location}!", values) == (
        "The barracks is that way. Past the barracks!"
    )
    assert fill_slots("Take it. {item}, fine steel.", values) == "Take it. A sword, fine steel."
