"""The word constraints' text rules (runtime.client.constraints.TEXT_RULES): no doubled punctuation
but a three-dot ellipsis, no space before a mark, no lower-case sentence start, no doubled word or
slot, by construction in the per-step masks, with the shipped tokenizer and on the shipped model."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.client.constraints import (
    MID_LINE,
    TEXT_RULES,
    WordConstraint,
    WordState,
    read_constraints,
    settled_text,
)
from runtime.client.generator import LineGenerator, LineRequest
from runtime.client.onnx_model import DEFAULT_MODEL_DIR
from runtime.factory.text_metrics import glitches
from runtime.tokenizer import Tokenizer

# the shipped constraints without the word bigrams: these tests pin the vocabulary, signature
# and text rules on their own (tests/runtime/client/test_bigrams.py pins the bigrams)
CONS = dataclasses.replace(read_constraints(DEFAULT_MODEL_DIR), bigrams=None)
VOCABULARY = frozenset(CONS.vocabulary or ())
RULED = {*TEXT_RULES, "stutter"}  # with the vocabulary every word is the book's: no stutter either
TOK = Tokenizer.load(DEFAULT_MODEL_DIR / "tokenizer.json")  # the shipped tokenizer
WORDS = CONS.word_constraint(TOK)


def ids(tok: Tokenizer, *pieces: str) -> list[int]:
    """The tokens of each piece in turn (marks, spaces and short words are one token each)."""
    return [i for p in pieces for i in tok.encode(p)]


def walk(words: WordConstraint, tokens: list[int]) -> WordState:
    state = WordState()
    for t in tokens:
        assert not words.blocked(state)[t], (state, t)
        state = words.step(state, t)
    return state


def lure_ids(tok: Tokenizer) -> list[int]:
    """Tokens a glitch is made of: marks, spaces, lower- and upper-case word starts, slots."""
    pieces = [".", "..", "...", ",", "!", "?", ";", ":", " ", " the", "the", " The", " you", " I", "'s", '"']
    return [i for p in pieces for i in tok.encode(p)] + [tok.id_of(f"<slot:{s}>") for s in tok.catalog["slots"]]


# ------------------------------------------------------------------ any walk the masks allow

@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), budget=st.integers(1, 40), bias=st.floats(0.0, 0.9))
def test_no_sequence_the_masks_allow_holds_a_glitch(seed, budget, bias):
    """Random walks through the allowed tokens of the shipped tokenizer (biased towards marks,
    spaces, repeats of the last token and slots) decode to text ``glitches`` finds nothing
    of the ruled kinds in; a walk left with no token (a dead end) shows its settled text, as the
    engines do."""
    tok, words = TOK, WORDS
    rng = np.random.default_rng(seed)
    lure = lure_ids(tok)
    state, out, stuck = WordState(), [], False
    for n in range(budget):
        blocked = words.blocked(state, last=n + 1 == budget)
        allowed = np.flatnonzero(~blocked)
        if not len(allowed):
            stuck = True
            break
        good = [i for i in [*lure, *out[-2:]] if not blocked[i]]
        nxt = int(rng.choice(good)) if good and rng.random() < bias else int(rng.choice(allowed))
        if nxt == tok.eos_id:
            break
        out.append(nxt)
        state = words.step(state, nxt)
    text = tok.decode(out)
    text = (settled_text(text) if stuck or state.mode else text).strip()
    assert not RULED & set(glitches(text, VOCABULARY)), (text, glitches(text, VOCABULARY))


def test_the_walk_without_the_text_rules_does_write_glitches():
    """The same walks with the text rules off write the glitches (so the test above can fail)."""
    tok = TOK
    loose = CONS.word_constraint(tok, text_rules=False)
    rng = np.random.default_rng(0)
    lure, found = lure_ids(tok), set()
    for _ in range(60):
        state, out = WordState(), []
        for n in range(20):
            blocked = loose.blocked(state, last=n + 1 == 20)
            allowed = np.flatnonzero(~blocked)
            if not len(allowed):
                break
            good = [i for i in [*lure, *out[-2:]] if not blocked[i]]
            nxt = int(rng.choice(good)) if good and rng.random() < 0.7 else int(rng.choice(allowed))
            if nxt == tok.eos_id:
                break
            out.append(nxt)
            state = loose.step(state, nxt)
        found.update(glitches(tok.decode(out).strip(), VOCABULARY))
    assert {"double_punct", "space_before_punct", "lowercase_start", "double_word"} <= found


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(walk_=st.lists(st.integers(0, 2**31), max_size=16), lure=st.booleans(), last=st.booleans())
def test_the_text_rules_mask_equals_the_character_reference(walk_, lure, last):
    """States reached by random walks (often through marks, spaces and repeats): the fast mask
    equals the token-by-token reference, text rules included."""
    tok, words = TOK, WORDS
    pool_lure = np.asarray(lure_ids(tok))
    state, prev = WordState(), []
    for k in walk_:
        blocked = words.blocked(state)
        pool = [i for i in [*pool_lure, *prev[-1:]] if not blocked[i]] if lure and k % 2 else []
        pool = pool or np.flatnonzero(~blocked).tolist()
        t = int(pool[k % len(pool)])
        if t == tok.eos_id:
            break
        prev.append(t)
        state = words.step(state, t)
    fast, ref = words.blocked(state, last=last), words.blocked_exact(state, last=last)
    assert np.array_equal(fast, ref), (tok.decode(prev), state, last, np.flatnonzero(fast != ref)[:10])


# ------------------------------------------------------------------ by hand

def test_an_ellipsis_is_exactly_three_dots():
    tok, words = TOK, WORDS
    dot, two, three, comma, bang = ids(tok, ".", "..", "...", ",", "!")
    well = ids(tok, "Well")
    s1 = walk(words, [*well, dot])
    assert not words.blocked(s1)[dot]  # "." -> ".." may still become "..."
    assert words.blocked(s1, last=True)[dot]  # not as the line's last token: ".." would end it
    assert not words.blocked(s1)[two] and not words.blocked(s1, last=True)[two]  # "." + ".." is "..."
    assert words.blocked(s1)[three] and words.blocked(s1)[comma]
    s2 = walk(words, [*well, dot, dot])
    allowed = np.flatnonzero(~words.blocked(s2))
    assert allowed.tolist() == [dot]  # only the third dot; not eos, a space, a word or a fourth dot
    s3 = words.step(s2, dot)
    assert words.blocked(s3)[dot] and words.blocked(s3)[comma] and words.blocked(s3)[bang]
    assert not words.blocked(s3)[tok.eos_id]
    for start in (well, [*well, bang]):
        st_ = walk(words, start)
        assert words.blocked(st_)[two] == (start != well) and words.blocked(st_, last=True)[two]
        assert words.blocked(st_)[three] == (start != well)  # "!..." is doubled punctuation
    assert words.advance(MID_LINE, "well... Now", final=True) is not None
    assert words.advance(MID_LINE, "well.... Now", final=True) is None
    assert words.advance(MID_LINE, "well.. Now", final=True) is None
    assert words.advance(MID_LINE, "well..", final=True) is None


def test_no_mark_follows_a_mark_or_a_space():
    tok, words = TOK, WORDS
    marks = ids(tok, ".", ",", "!", "?", ";", ":", "..", "...")
    for after in (",", "!", "?", ";", ":"):
        state = walk(words, ids(tok, "Halt", after))
        assert all(words.blocked(state)[m] for m in marks), after
        spaced = words.step(state, ids(tok, " ")[0])
        assert all(words.blocked(spaced)[m] for m in marks), after
    state = walk(words, ids(tok, "Halt", " "))
    assert all(words.blocked(state)[m] for m in marks)  # no space before a mark
    assert not any(words.blocked(walk(words, ids(tok, "Halt")))[m] for m in marks)


def test_a_sentence_starts_upper_case():
    tok, words = TOK, WORDS
    lower = ids(tok, "the")[0]  # (a lower-case piece of "the")
    upper, spaced_lower, spaced_upper = ids(tok, "The", " the", " The")
    start = WordState()
    assert words.blocked(start)[lower] and words.blocked(start)[spaced_lower]
    assert not words.blocked(start)[upper] and not words.blocked(start)[spaced_upper]
    for end in ("!", "?", ".", "..."):
        state = walk(words, ids(tok, "Halt", end))
        assert words.blocked(state)[spaced_lower] and not words.blocked(state)[spaced_upper], end
        spaced = words.step(state, ids(tok, " ")[0])
        assert words.blocked(spaced)[lower] and not words.blocked(spaced)[upper], end
        assert not words.blocked(spaced)[ids(tok, " ")[0]]  # pure spaces pass and keep the rule
    after_comma = walk(words, ids(tok, "Halt", ","))
    assert not words.blocked(after_comma)[spaced_lower]


def test_slot_tokens_start_a_sentence_and_are_never_doubled():
    tok, words = TOK, WORDS
    player, item = tok.id_of("<slot:player>"), tok.id_of("<slot:item>")
    start = WordState()
    assert not words.blocked(start)[player]  # a slot value at a sentence start is capitalised on filling
    state = walk(words, [*ids(tok, "Halt", "!", " "), player])
    assert words.blocked(state)[player] and not words.blocked(state)[item]  # no "{player}{player}"
    spaced = words.step(state, ids(tok, " ")[0])
    assert words.blocked(spaced)[player]  # no "{player} {player}"
    comma = words.step(state, ids(tok, ",")[0])
    assert not words.blocked(comma)[ids(tok, " ")[0]]
    assert not words.blocked(words.step(comma, ids(tok, " ")[0]))[player]  # "{player}, {player}" is fine
    assert words.advance(WordState(), "{item}, you say? {item} it is.", final=True) is not None
    assert words.advance(WordState(), "{item} {item}", final=True) is None


def test_no_apostrophe_is_glued_to_a_slot():
    """The game fills a slot with its own text ("the fields"): "{location}'s" would read "the
    fields's", so no token may start with an apostrophe right after a slot token."""
    tok, words = TOK, WORDS
    location = tok.id_of("<slot:location>")
    state = walk(words, [*ids(tok, "Try", " "), location])
    for glued in ("'s", "'"):
        assert words.blocked(state)[tok.encode(glued)[0]], glued
    assert not words.blocked(state)[ids(tok, " ")[0]] and not words.blocked(state)[ids(tok, ",")[0]]
    assert words.advance(MID_LINE, "try {location}'s way") is None
    assert words.advance(MID_LINE, "try {location}, it's that way", final=True) is not None
    assert glitches("Try {location}'s way.") == ["slot_possessive"] and not glitches("Try {location}, it's near.")


def test_a_word_is_never_doubled():
    tok, words = TOK, WORDS
    the, space, comma = ids(tok, " the", " ", ",")
    state = walk(words, [*ids(tok, "Halt", ","), the, the])
    blocked = words.blocked(state)
    assert blocked[space] and blocked[comma] and blocked[tok.eos_id]  # "the the" may not end
    assert not blocked[tok.encode("m")[0]]  # "the them" may
    assert words.blocked(walk(words, [*ids(tok, "Halt", ","), the]), last=True)[the]
    assert words.advance(MID_LINE, "the the", final=True) is None
    assert words.advance(MID_LINE, "the them", final=True) is not None
    assert words.advance(MID_LINE, "the, the", final=True) is not None  # not doubled: a comma between
    assert words.advance(MID_LINE, "the  the ") is None  # spaces only between


def test_digits_quotes_and_apostrophes_pass_at_a_sentence_start():
    """Without a vocabulary (digits, quotes allowed): only a lower-case letter is held back."""
    tok = TOK
    loose = WordConstraint([], tok)
    for text in ('"hm." No.', "3 men. 4 more", "'Tis so. Aye", "... no"):
        moved = loose.advance(WordState(), text, final=True)
        assert (moved is None) == (text == "... no"), text  # a line does not start with a mark
    assert loose.advance(WordState(), "hm", final=True) is None


def test_settled_text_shows_an_unfinished_ellipsis_as_one_dot():
    assert settled_text("Wait..") == "Wait."
    assert settled_text("Wait...") == "Wait..."
    assert settled_text("Wait.. wh") == "Wait.. "  # (never allowed by the masks; the rule is for the end only)


def test_the_text_rules_can_be_switched_off():
    tok = TOK
    loose = CONS.word_constraint(tok, text_rules=False)
    assert loose.advance(WordState(), "hello.. the the", final=True) is not None
    assert not loose.blocked(WordState())[tok.encode("the")[0]]


# ------------------------------------------------------------------ the shipped model

def test_the_engine_writes_no_glitch_in_any_prompt_shape():
    """Seeded requests over every archetype x state x intent (cycled), 0-2 persona traits and 0-4
    context slots: no line holds a glitch of the ruled kinds (nor the noble's doubled period of
    issue #12)."""
    gen = LineGenerator.load(max_resamples=2)
    cat = gen.catalog()
    rng = np.random.default_rng(12)
    combos = [(a, s, i) for a in cat["archetypes"] for s in cat["states"] for i in cat["intents"]]
    order = rng.permutation(len(combos))[:360]
    bad, model_lines = [], 0
    for j, k in enumerate(order):
        arch, state, intent = combos[k]
        persona = sorted(rng.choice(cat["persona_traits"], size=j % 3, replace=False).tolist())
        slots = rng.choice(list(cat["context"]), size=j % 5, replace=False)
        ctx = {str(s): str(rng.choice(cat["context"][s])) for s in slots}
        line = gen.generate_request(LineRequest(arch, state, persona=persona, intent=intent, context=ctx,
                                                seed=j, npc_id=j))
        if line.fallback:
            continue
        model_lines += 1
        found = RULED & set(glitches(line.raw_text, VOCABULARY))
        if found:
            bad.append((line.raw_text, found))
    assert model_lines >= 0.9 * len(order)
    assert bad == []
    noble = gen.generate("noble", "alert", intent="greet", context={"reputation": "hostile"}, seed=2)
    assert ".." not in noble.text.replace("...", "") and not glitches(noble.text, VOCABULARY)
