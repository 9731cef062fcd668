"""The redraw policy of the word constraints' veto: a stopped sample is drawn again from its last
sentence end (runtime.client.constraints.restart_point), not from the line's start; at the budget's
last token a veto ends the line where it stands; an ellipsis under way is never vetoed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from runtime.client.constraints import WordState, read_constraints, restart_point, vetoed
from runtime.client.generator import LineGenerator, LineRequest
from runtime.client.onnx_model import DEFAULT_MODEL_DIR
from runtime.tokenizer import Tokenizer

TOK = Tokenizer.load(DEFAULT_MODEL_DIR / "tokenizer.json")
WORDS = read_constraints(DEFAULT_MODEL_DIR).word_constraint(TOK)


def states_of(text: str) -> list[WordState]:
    out, state = [], WordState()
    for t in TOK.encode(text):
        state = WORDS.step(state, t)
        out.append(state)
    return out


def test_the_restart_point_is_the_last_sentence_end_before_the_stop():
    text = "Halt! Who goes there? I see"
    states = states_of(text)
    keep = restart_point(states)
    assert TOK.decode(TOK.encode(text)[:keep]) == "Halt! Who goes there?"
    assert restart_point(states_of("Halt, who goes")) == 0  # no sentence end: from the line's start
    # a sentence end right before the stop is not one: the same logits would stop it again
    assert TOK.decode(TOK.encode("Halt! Go.")[:restart_point(states_of("Halt! Go."))]) == "Halt!"


def test_an_ellipsis_under_way_is_never_vetoed():
    raw = np.full(TOK.vocab_size, -10.0, dtype=np.float32)
    raw[TOK.eos_id] = 10.0  # the model wants to end the line after ".."
    state = states_of("Well..")[-1]
    masked = raw.copy()
    WORDS.mask_logits(masked, state)
    assert not np.isfinite(masked[TOK.eos_id])  # a line never ends on ".."
    assert vetoed(raw, masked) and not vetoed(raw, masked, state=state)


@pytest.fixture(scope="module")
def gen() -> LineGenerator:
    return LineGenerator.load(max_resamples=2)


def village(gen: LineGenerator, n: int, tokens: int) -> list[LineRequest]:
    cat = gen.catalog()
    rng = np.random.default_rng(7)
    out = []
    for j in range(n):
        slots = rng.choice(list(cat["context"]), size=int(rng.integers(0, 3)), replace=False)
        out.append(LineRequest(str(rng.choice(cat["archetypes"])), str(rng.choice(cat["states"])),
                               intent=str(rng.choice(cat["intents"])),
                               context={str(s): str(rng.choice(cat["context"][s])) for s in slots},
                               seed=j, max_tokens=tokens, min_tokens=tokens, npc_id=("redraw", j)))
    return out


def test_a_redrawn_line_keeps_the_sentences_before_the_stop(gen, monkeypatch):
    resumed: list[tuple[Any, list[int], int]] = []
    original = gen._resumed_row

    def spy(prev: Any, keep: int, seed: Any) -> Any:
        resumed.append((prev.finish, list(prev.tokens), keep))
        return original(prev, keep, seed)

    monkeypatch.setattr(gen, "_resumed_row", spy)
    lines = [gen.generate_request(r) for r in village(gen, 60, 24)]
    assert resumed, "no sample was drawn again from a sentence end in 60 forced lines"
    for finish, tokens, keep in resumed:
        assert finish == "blocked" and 0 < keep < len(tokens)
        assert TOK.decode(tokens[:keep]).rstrip()[-1] in ".!?"
    redrawn = [line for line in lines if line.attempts > 1 and not line.fallback]
    # the budget counts the kept tokens (a line may stop one short: a veto at its last token)
    assert redrawn and all(len(line.tokens) in (23, 24) for line in redrawn)


def test_a_veto_at_the_budgets_last_token_ends_the_line_there(gen, monkeypatch):
    """Lines forced to their budget are never drawn again for where the budget cuts them: a
    word that could not end within it is left out (the line ends at its last whole word)."""
    redraws: list[int] = []
    original = gen._new_row

    def spy(prep: Any, seed: Any) -> Any:
        if isinstance(seed, list):
            redraws.append(1)
        return original(prep, seed)

    monkeypatch.setattr(gen, "_new_row", spy)
    monkeypatch.setattr(gen, "_resumed_row", lambda prev, keep, seed: (redraws.append(1), original(prev.prep, seed))[1])
    lines = [gen.generate_request(r) for r in village(gen, 40, 1)]
    assert not redraws
    assert all(line.fallback or line.finish_reason in ("length", "eos") for line in lines)
