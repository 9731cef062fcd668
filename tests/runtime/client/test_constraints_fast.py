"""The word constraints' fast paths agree with the readings they shortcut (runtime.client.constraints,
runtime.client.bigrams): the bigram masks' range search (and the table of a word boundary's
mask per word before, made at load), the word-end tokens kept per word, the
doubled-word rule's reach test, masked_row's shared top token and the bounded memo that keeps
the masks. The shipped model's
constraints.json (vocabulary, signatures, voice bonus, word bigrams) and tokenizer, no model."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.client.bigrams import ANY, PIECE, BigramMask
from runtime.client.constraints import (
    _APOSTROPHE,
    _BOUNDARY,
    _DOT2,
    _LETTERS,
    WordConstraint,
    WordState,
    _Memo,
    read_constraints,
    vetoed,
)
from runtime.paths import DEFAULT_MODEL_DIR
from runtime.tokenizer import Tokenizer

TOK = Tokenizer.load(DEFAULT_MODEL_DIR / "tokenizer.json")


@pytest.fixture(scope="module")
def wc() -> WordConstraint:
    cons = read_constraints(DEFAULT_MODEL_DIR)
    assert cons.bigrams is not None and cons.voice, "the shipped constraints carry the bigrams and the voice bonus"
    return cons.word_constraint(TOK)


@pytest.fixture(scope="module")
def bg(wc: WordConstraint) -> BigramMask:
    assert wc._bigrams is not None
    return wc._bigrams


def _prevs(bg: BigramMask, rng: np.random.Generator) -> list[int]:
    """Words before of every kind: a piece start, nothing known, words with no, few and many successors."""
    sizes = np.asarray([len(r) for r in bg._rows])
    empty = np.flatnonzero(sizes == 0)
    many = np.argsort(-sizes)[:3]
    return [PIECE, ANY, *many.tolist(), *(empty[:2].tolist()), *rng.integers(0, len(bg._rows), 12).tolist()]


def test_the_range_search_finds_the_misses_of_the_reference_for_every_lead_and_word_start(bg):
    wc = bg.wc
    rng = np.random.default_rng(3)
    for prev in _prevs(bg, rng):
        ids = bg._set(prev)
        for last in (False, True):
            want = bg._misses(ids, wc._walk_reached, wc._walk_apos, last)
            assert np.array_equal(bg._missed(ids, bg._walk_ranges[last]), want), (prev, last)
            toks = bg._with_tail
            want = bg._misses(ids, bg._tail_node[toks], bg._tail_pending[toks], last)
            assert np.array_equal(bg._missed(ids, bg._tail_ranges[last]), want), (prev, last)
            if ids is not None:  # (the table made at load, a row per word before)
                table = bg._tail_ranges[last][1] & ~bg._tail_fit[last][bg._row_of(prev)]
                assert np.array_equal(table, want), (prev, last)
        if ids is not None and len(bg._slots):
            slot = bg._slot[bg._slots]
            assert np.array_equal(bg._missed(ids, bg._slot_ranges), ~bg._fits(ids, slot, slot + 1)), prev
    assert bg._missed(None, bg._walk_ranges[False]).sum() == 0  # nothing known: no lead is judged


def test_a_word_state_blocks_the_same_tokens_as_the_token_by_token_reference(wc, bg):
    rng = np.random.default_rng(11)
    prevs = _prevs(bg, rng)
    checked = 0
    for k in range(14):
        node = int(rng.integers(1, len(wc._child)))
        spelled = wc._spelled[node]
        if "'" in spelled:
            continue
        mode = _APOSTROPHE if (wc._is_word[node] and k % 3 == 0) else _LETTERS
        state = WordState(node, mode, prev=prevs[k % len(prevs)])
        last = k % 4 == 3
        fast = np.zeros(wc.vocab_size, dtype=bool)
        fast[bg.blocked(state, last)] = True
        assert np.array_equal(fast, bg.blocked_exact(state, last)), (state, last)
        checked += 1
    assert checked >= 8


def test_the_word_end_tokens_kept_per_word_are_those_the_word_after_blocks(wc, bg):
    rng = np.random.default_rng(5)
    for word in rng.integers(0, len(bg._rows) - len(bg.table.slots), 8).tolist():
        for mode in (_LETTERS, _APOSTROPHE, 3):
            for last in (False, True):
                after = bg.blocked(WordState(prev=word), last)
                want = set(after[wc._ends_mask[mode][after]].tolist())
                got = bg._ends_after(word, mode, last)
                assert set(got.tolist()) == want and not got.flags.writeable, (word, mode, last)


def test_the_doubled_word_rule_blocks_what_the_reference_does_with_the_echo_in_and_out_of_reach(wc):
    """A word being spelled whose echo (the word before, only spaces since) lies below it in the
    trie, and one whose echo cannot be reached from it: the rule's tokens as the reference reads them
    (the echo out of reach shares the rule's kept tokens with no echo at all)."""
    rng = np.random.default_rng(7)
    words = [n for n in range(1, len(wc._child)) if wc._is_word[n] and "'" not in wc._spelled[n]]
    # words one letter short of a leaf word (a repeat of which has no way on): one token reaches it
    near = [wc._parent[n] for n in words if not wc._child[n] and wc._is_word[wc._parent[n]]]
    done = reached = 0
    for node in rng.choice(near, 6, replace=False).tolist():
        leaf = next(n for n in range(node + 1, wc._subtree_end[node]) if not wc._child[n] and wc._is_word[n])
        outside = int(rng.choice([w for w in words if not node <= w < wc._subtree_end[node]]))
        shape = wc._shape_next[0][TOK.encode(" a")[0]]  # (mid-line, after a word and a space)
        # (nothing known of the word before: the bigrams leave the repeat to the rule)
        alone = wc.blocked(wc._state(node, _LETTERS, 0, shape, -1)._replace(prev=ANY))
        for echo in (leaf, outside):
            state = wc._state(node, _LETTERS, 0, shape, echo)._replace(prev=ANY)
            for last in (False, True):
                assert np.array_equal(wc.blocked(state, last=last), wc.blocked_exact(state, last=last)), (
                    wc._spelled[node], wc._spelled[echo], last)
            reached += echo == leaf and not np.array_equal(wc.blocked(state), alone)
            done += 1
        kept = wc._rules.peek((node, _LETTERS, outside, False, -1))
        assert kept is not None and kept is wc._rules.peek((node, _LETTERS, -1, False, -1))
    assert done >= 12 and reached >= 3  # (the rule did block the repeat where the echo is in reach)


@pytest.mark.parametrize("peaked", [False, True])
def test_masked_row_masks_adds_the_bonus_and_vetoes_as_the_separate_steps_do(wc, peaked):
    rng = np.random.default_rng(17 + peaked)
    ban = wc.banned_bits("guard", ["gruff"], {"time_of_day": "night"})
    state = WordState()
    vetoes = expected = 0
    for k in range(40):
        raw = rng.normal(0.0, 2.0, wc.vocab_size).astype(np.float32)
        blocked = np.flatnonzero(wc.blocked(state, banned=ban))
        if peaked:  # the model's favourite is a blocked token, far ahead: a veto (not mid-ellipsis)
            raw[int(blocked[k % len(blocked)])] = 40.0
            expected += state.shape != _DOT2
        row, veto = wc.masked_row(raw, state, banned=ban)
        want = raw.copy()
        wc.mask_logits(want, state, banned=ban)
        assert np.array_equal(row, want) and veto == vetoed(raw, want, state=state), k
        vetoes += veto
        allowed = np.flatnonzero(np.isfinite(row))
        allowed = allowed[allowed != TOK.eos_id]
        if not len(allowed) or (state.mode == _BOUNDARY and rng.random() < 0.2):
            state = WordState()  # (a dead end, or a new line now and then)
            continue
        state = wc.step(state, int(allowed[np.argmax(row[allowed])]))
    assert vetoes == expected and (expected >= 35 if peaked else expected == 0)


def test_a_word_mask_shared_by_words_before_with_the_same_successors_below_is_the_reference_for_each(wc, bg):
    """Inside a word the bigram mask is kept by the successors below the word being spelled: two
    words before with different successors, the same ones below the node (none, or some), each
    get the mask the token-by-token reference gives them, from a fresh memo and then shared."""
    rng = np.random.default_rng(23)
    rows = [r.tolist() for r in bg._rows[: len(bg._rows) - len(bg.table.slots)]]
    shared = 0
    for node in rng.choice(np.flatnonzero(wc._is_word_np[1:]) + 1, 60, replace=False).tolist():
        if "'" in wc._spelled[node]:
            continue
        lo, hi = int(bg._lo[node]), int(bg._hi[node])
        below: dict[tuple[int, ...], list[int]] = {}
        for prev, row in enumerate(rows):
            below.setdefault(tuple(i for i in row if lo <= i < hi), []).append(prev)
        pairs = [ps[:2] for s, ps in below.items() if len(ps) >= 2 and rows[ps[0]] != rows[ps[1]]]
        if not pairs:
            continue
        fresh = read_constraints(DEFAULT_MODEL_DIR).word_constraint(TOK)._bigrams
        assert fresh is not None
        for a, b in pairs[:2]:
            for last in (False, True):
                for prev in (a, b):
                    state = WordState(node, _LETTERS, prev=prev)
                    got = np.zeros(wc.vocab_size, dtype=bool)
                    got[fresh.blocked(state, last)] = True
                    assert np.array_equal(got, fresh.blocked_exact(state, last)), (wc._spelled[node], prev, last)
                shared += fresh.blocked(WordState(node, _LETTERS, prev=a), last) is \
                    fresh.blocked(WordState(node, _LETTERS, prev=b), last)
        if shared >= 8:
            break
    assert shared >= 8  # (the two words before did share one kept mask)


def test_a_memo_keeps_its_newest_entries_and_makes_a_missing_one_once():
    """The bounded memo behind every kept mask: ``put`` keeps an entry and returns it, the oldest
    entries go first past ``size``, ``get`` makes a missing entry once and then serves it, and
    ``peek`` answers None for an entry it does not hold."""
    memo = _Memo(3)
    assert [memo.put(k, k * 10) for k in range(5)] == [0, 10, 20, 30, 40]
    assert len(memo) == 3 and [memo.peek(k) for k in range(5)] == [None, None, 20, 30, 40]
    made: list[int] = []
    assert memo.get(7, lambda: made.append(7) or 70) == 70
    assert memo.get(7, lambda: made.append(8) or 80) == 70
    assert made == [7] and memo.peek(2) is None and len(memo) == 3
