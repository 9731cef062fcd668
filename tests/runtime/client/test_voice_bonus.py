"""The voice bonus (runtime.client.constraints.WordConstraint.voice_bonus): signature words of the
tags a request asked for are worth more, spread over their tokens by a potential over the
vocabulary's trie; it never unblocks a token and ships in constraints.json."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.client.constraints import Constraints, WordConstraint, WordState, read_constraints
from runtime.client.onnx_model import DEFAULT_MODEL_DIR
from runtime.tokenizer import Tokenizer

TOK = Tokenizer.load(DEFAULT_MODEL_DIR / "tokenizer.json")
CONS = read_constraints(DEFAULT_MODEL_DIR)
VOCAB = ["the", "night", "nights", "nice", "is", "dark", "day", "daylight", "halt", "a", "cold"]
SIGS = {"context:time_of_day=night": ["night", "dark", "cold night"], "context:time_of_day=day": ["daylight"],
        "archetype:guard": ["halt"], "archetype:merchant": ["nice"]}


def small(**voice: float) -> WordConstraint:
    return WordConstraint([], TOK, vocabulary=VOCAB, signatures=SIGS, voice=voice)


def total_bonus(words: WordConstraint, text: str, banned: int) -> float:
    state, total = WordState(), 0.0
    for t in TOK.encode(text):
        total += float(words.voice_bonus(state, banned=banned)[t])
        state = words.step(state, t)
    return total + float(words.voice_bonus(state, banned=banned)[TOK.eos_id])


def test_a_line_is_worth_the_signature_words_it_completes():
    """Summed over a whole line, the bonuses are the requested words' worth, less the root's
    potential once per word (the same for every line of that many words): the spread over
    tokens changes where the bonus is paid, not how much a word is worth."""
    words = small(context=2.0, archetype=1.0)
    ban = words.banned_bits("guard", (), {"time_of_day": "night"})
    phi0 = float(words._voice_for(ban).phi[0])
    assert total_bonus(words, "Halt, the night is dark", ban) == pytest.approx(1.0 + 2.0 + 2.0 - 5 * phi0, abs=1e-4)
    assert total_bonus(words, "The day is nice", ban) == pytest.approx(-4 * phi0, abs=1e-4)
    # a word completing two phrases of one tag ("night", "cold night") is worth the tag once
    assert total_bonus(words, "A cold night", ban) == pytest.approx(2.0 - 3 * phi0, abs=1e-4)


def test_requested_signatures_are_drawn_and_unasked_ones_pushed_away():
    words = small(context=3.0, unasked=1.0)
    night = words.banned_bits("guard", (), {"time_of_day": "night"})
    day = words.banned_bits("guard", (), {"time_of_day": "day"})
    night_tok, day_tok = TOK.encode(" night")[0], TOK.encode(" daylight")[0]
    state = words.advance(WordState(), "The")
    at_night, by_day = words.voice_bonus(state, banned=night), words.voice_bonus(state, banned=day)
    assert at_night[night_tok] > 1.0 and by_day[night_tok] < 0  # (the rest when "night" ends: "nights" is no signature)
    assert not np.any(words.voice_bonus(state, banned=night)[TOK.encode(" is")[0]] > 0)
    assert words.voice_bonus(state, banned=night).any() and not small().voice_bonus(state, banned=night).any()
    assert by_day[day_tok] > 1.0 and at_night[day_tok] < 0  # "daylight" asked by day


def test_the_bonus_never_unblocks_a_token_and_keeps_to_what_the_model_finds_plausible():
    words = CONS.word_constraint(TOK, voice={"context": 6.0, "persona": 6.0, "within": 3.0})
    plain = CONS.word_constraint(TOK, voice={})
    ban = words.banned_bits("guard", ("gruff",), {"time_of_day": "night"})
    rng = np.random.default_rng(0)
    state = WordState()
    for t in TOK.encode("Hmph! It is a dark night, and the"):
        raw = rng.normal(0, 3, TOK.vocab_size).astype(np.float32)
        with_voice, without = raw.copy(), raw.copy()
        words.mask_logits(with_voice, state, banned=ban)
        plain.mask_logits(without, state, banned=ban)
        assert np.array_equal(np.isinf(with_voice), np.isinf(without))
        far = raw < raw.max() - 3.0
        assert np.array_equal(with_voice[far], without[far])  # no bonus where the model would not go
        state = words.step(state, t)


def test_the_voice_bonus_ships_in_constraints_json_and_bad_sizes_are_refused():
    assert CONS.voice and set(CONS.voice) <= {"archetype", "persona", "context", "unasked", "within"}
    data = CONS.to_json()
    assert Constraints.from_json(data).voice == CONS.voice
    for bad, what in (({"tone": 1.0}, "unknown kind 'tone'"), ({"persona": -1}, "'persona' must be")):
        with pytest.raises(ValueError, match=what):
            Constraints.from_json({**data, "voice_bonus": bad})
    assert Constraints.from_json({k: v for k, v in data.items() if k != "voice_bonus"}).voice is None
