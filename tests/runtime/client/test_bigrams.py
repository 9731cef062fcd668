"""The book's word bigrams (runtime.client.bigrams): derived at export, shipped in
constraints.json, checked by the loaders, and kept by the engine's masks."""

from __future__ import annotations

import json
import shutil
from typing import Any

import numpy as np
import pytest

from runtime.client.bigrams import (
    ANY,
    PIECE,
    BigramTable,
    bigram_pairs,
    pack_ids,
    piece_words,
    unpack_ids,
)
from runtime.client.constraints import (
    _APOSTROPHE,
    _LETTERS,
    Constraints,
    WordState,
    expanded_document,
    read_constraints,
)
from runtime.client.generator import LineGenerator, LineRequest, ModelLoadError
from runtime.paths import DEFAULT_MODEL_DIR
from tests.runtime.client.walks import random_walk


@pytest.fixture(scope="module")
def derived(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    """constraints.json as the export writes it with the table (the document, what it reported)."""
    from runtime.factory.export import write_constraints

    path = tmp_path_factory.mktemp("bigrams") / "constraints.json"
    info = write_constraints(path, bigrams=True)
    return json.loads(path.read_text(encoding="utf-8")), info


@pytest.fixture(scope="module")
def cons(derived: tuple[dict[str, Any], dict[str, Any]]) -> Constraints:
    return Constraints.from_json(derived[0])


@pytest.fixture(scope="module")
def table(cons: Constraints) -> BigramTable:
    assert cons.bigrams is not None
    return cons.bigrams


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> LineGenerator:
    """The shipped model with its constraints.json stripped of the table and of the word trigrams
    (the engine before either: the trigram check would refuse most unseen word pairs too)."""
    root = tmp_path_factory.mktemp("plain") / "flash"
    shutil.copytree(DEFAULT_MODEL_DIR, root)
    doc = json.loads((root / "constraints.json").read_text(encoding="utf-8"))
    doc.pop("bigrams", None)
    doc.pop("trigrams", None)
    (root / "constraints.json").write_text(json.dumps(doc), encoding="utf-8")
    gen = LineGenerator.load(root, warmup=False)
    assert gen.mask._bigrams is None
    return gen


@pytest.fixture(scope="module")
def paired(table: BigramTable) -> LineGenerator:
    return LineGenerator.load(bigrams=table, warmup=False)


def requests(gen: LineGenerator, n: int, seed: int) -> list[LineRequest]:
    """``n`` requests of every prompt shape (0-2 traits, 0-4 context slots, the player named or
    not), sampled (some hotter than the default) and greedy."""
    cat = gen.catalog()
    rng = np.random.default_rng(seed)
    slots = list(cat["context"])
    out = []
    for j in range(n):
        persona = sorted(rng.choice(cat["persona_traits"], size=int(rng.integers(0, 3)), replace=False).tolist())
        ctx = {s: str(rng.choice(cat["context"][s]))
               for s in rng.choice(slots, size=int(rng.integers(0, len(slots) + 1)), replace=False)}
        if j % 3 == 0:
            ctx["player"] = "Ada"
        out.append(LineRequest(str(rng.choice(cat["archetypes"])), str(rng.choice(cat["states"])), persona=persona,
                               intent=str(rng.choice(cat["intents"])), context=ctx, seed=int(rng.integers(2**31)),
                               temperature=[None, 1.1, 0.0][j % 3], npc_id=("bigrams", j)))
    return out


# ------------------------------------------------------------------ the table


def test_piece_words_split_at_piece_marks_and_count_slots_as_words():
    assert piece_words("Hm. The {location}, at NIGHT; don't... stay!") == [
        ["hm"], ["the", "{location}"], ["at", "night"], ["don't"], ["stay"]]
    assert bigram_pairs("Well-met, {player}'s friend: ok") == [("well", "met"), ("{player}", "s"), ("s", "friend")]
    assert piece_words("... !") == []


def test_the_export_derives_the_table_from_the_lines_the_vocabulary_comes_from(derived, table):
    from runtime.factory.linebook import load_line_book

    doc, info = derived
    book = load_line_book()
    assert table.words == tuple(expanded_document(doc)["vocabulary"]) == tuple(book.vocabulary())
    assert table.slots == tuple(book.slots)
    said = {table.token(int(i)) for i in table.starts} | {table.token(int(j)) for j in table.successors}
    assert said - {f"{{{s}}}" for s in book.slots} == set(book.vocabulary())  # every word, by one rule
    pairs, starts = table.pairs(), table.start_words()
    examples = book.examples()
    for e in examples[:: max(1, len(examples) // 3000)]:
        assert set(bigram_pairs(e.text)) <= pairs, e.text
        assert {ws[0] for ws in piece_words(e.text)} <= starts, e.text
    assert ("storm", "storm's") not in pairs and ("the", "this") not in pairs  # garbled lines' joins
    assert info["bigrams"]["pairs"] == len(table.successors) == len(pairs)
    assert info["bigrams"]["bytes"] == len(json.dumps(doc["bigrams"], separators=(",", ":")))
    assert 0 < info["bigrams"]["bytes"] < info["bytes"]
    assert BigramTable.from_json(table.to_json(), table.words, table.slots) == table
    assert Constraints.from_json(Constraints.from_json(doc).to_json()).bigrams == table


# ------------------------------------------------------------------ the masks


def _random_state(wc: Any, rng: np.random.Generator, rows: int) -> WordState:
    """A state inside a word of the trie (or at a boundary) after a random word, slot, piece
    start, nothing known, or a word with no successor."""
    empty = [i for i in range(rows) if not len(wc._bigrams._rows[i])]
    prev = [PIECE, ANY, int(rng.integers(0, rows)), rows - 1, int(rng.choice(empty)) if empty else PIECE][
        int(rng.integers(0, 5))]
    if rng.random() < 0.3:
        return WordState(prev=prev)
    node = int(rng.integers(1, len(wc._child)))
    spelled = wc._spelled[node]
    if "'" in spelled:
        if spelled.endswith("'"):
            node = wc._parent[node]
            return WordState(node, _APOSTROPHE, prev=prev)
        return WordState(node, 3, prev=prev)
    if (wc._is_word[node] or "'" in wc._child[node]) and rng.random() < 0.3:
        return WordState(node, _APOSTROPHE, prev=prev)
    return WordState(node, _LETTERS, prev=prev)


def test_the_mask_equals_the_token_by_token_reference_on_random_trie_states(cons, table, plain):
    wc = cons.word_constraint(plain.tokenizer)
    rng = np.random.default_rng(12)
    hits = 0
    for k in range(60):
        state = _random_state(wc, rng, table.size)
        last = bool(k % 4 == 3)
        fast = np.zeros(wc.vocab_size, dtype=bool)
        fast[wc._bigrams.blocked(state, last)] = True
        assert np.array_equal(fast, wc._bigrams.blocked_exact(state, last)), (state, last)
        hits += int(fast.any())
    assert hits >= 40  # the states do block something
    for k in range(6):  # and the whole mask (vocabulary, phrases, text rules, bigrams) its reference
        state = _random_state(wc, rng, table.size)
        assert np.array_equal(wc.blocked(state, last=k == 5), wc.blocked_exact(state, last=k == 5)), state


def test_step_keeps_the_word_before_as_the_reference_reader_does(cons, plain):
    wc = cons.word_constraint(plain.tokenizer)
    tok = plain.tokenizer
    rng = np.random.default_rng(5)
    seen = set()
    for _ in range(10):
        states = random_walk(wc, tok.eos_id, rng, int(rng.integers(1, 12)))
        seen.update(s.prev for s in states)
        state = states[-1] if states else WordState()
        for t in range(tok.vocab_size):
            assert wc.step(state, t).prev == wc._bigrams._walk(state, t, False, False)[1], (state, t)
    assert PIECE in seen and any(p >= 0 for p in seen)


def test_the_engine_never_writes_an_unseen_bigram_within_a_piece(paired, plain, table):
    pairs, starts = table.pairs(), table.start_words()
    reqs = requests(paired, 120, seed=7)
    unseen_without = 0
    model_lines = 0
    for r in reqs:
        line = paired.generate_request(r)
        assert set(bigram_pairs(line.raw_text)) <= pairs, line.raw_text
        assert {ws[0] for ws in piece_words(line.raw_text)} <= starts, line.raw_text
        model_lines += not line.fallback
        before = plain.generate_request(r)
        unseen_without += not set(bigram_pairs(before.raw_text)) <= pairs
    assert model_lines >= 100
    # the same requests without the table do join unseen words (model v5.1, which says book v5's
    # whole lines: 2 of 120; v3.4: more)
    assert unseen_without >= 1


def test_without_the_key_a_constraints_file_decodes_exactly_as_before(tmp_path, derived, plain, paired):
    doc = {k: v for k, v in derived[0].items() if k not in ("bigrams", "trigrams")}
    assert Constraints.from_json(doc).bigrams is None
    root = tmp_path / "flash"
    shutil.copytree(DEFAULT_MODEL_DIR, root)
    (root / "constraints.json").write_text(json.dumps(doc), encoding="utf-8")
    gen = LineGenerator.load(root, warmup=False)
    assert gen.mask._bigrams is None
    differs = 0
    for r in requests(gen, 40, seed=3):
        got, want = gen.generate_request(r), plain.generate_request(r)
        assert (got.tokens, got.text, got.attempts) == (want.tokens, want.text, want.attempts)
        differs += paired.generate_request(r).tokens != want.tokens
    assert differs >= 1  # (the table does change lines: the equality above is not vacuous)


# ------------------------------------------------------------------ loaders


def _bad(table: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    out = {**table, **change}
    return {k: v for k, v in out.items() if v is not None}


BAD = [
    ({"offsets": [0, 1]}, "bigrams.offsets must hold"),
    ({"next": [10**6]}, "bigrams.next: ids must be in"),
    ({"starts": [5, 3]}, "bigrams.starts must be sorted"),
    ({"starts": "all"}, "bigrams.starts must be a list of integers"),
    ({"slots": ["dragon"]}, "bigrams.slots must list"),
    ({"next": None}, "bigrams: missing next"),
    ({"extra": 1}, "bigrams: unknown key 'extra'"),
    ({"next": "u16:not base64!"}, "bigrams.next: not base64"),
    ({"next": "i8:AAAA"}, "bigrams.next must be a list of integers or a packed string"),
    ({"next": "u16:AAAA"}, "bigrams.next: 3 bytes is not"),
]


def test_the_export_packs_the_id_arrays_and_a_list_reads_the_same(derived):
    doc = derived[0]
    packed = doc["bigrams"]
    assert all(packed[k].startswith("u16:") for k in ("starts", "offsets", "next"))
    listed = {k: (v if k == "slots" else unpack_ids(v).tolist()) for k, v in packed.items()}
    assert len(json.dumps(packed)) < 0.75 * len(json.dumps(listed))
    assert Constraints.from_json({**doc, "bigrams": listed}).bigrams == Constraints.from_json(doc).bigrams
    assert unpack_ids(pack_ids(np.array([0, 70_000]))).tolist() == [0, 70_000]  # u32 past 65,535
    assert pack_ids(np.array([0, 70_000])).startswith("u32:")


@pytest.mark.parametrize(("change", "reason"), BAD)
def test_a_malformed_table_is_refused_naming_the_file_and_the_field(tmp_path, derived, change, reason):
    doc = dict(derived[0])
    doc["bigrams"] = _bad(doc["bigrams"], change)
    root = tmp_path / "flash"
    shutil.copytree(DEFAULT_MODEL_DIR, root)
    (root / "constraints.json").write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(ValueError, match=r"constraints\.json: not a constraints file") as err:
        read_constraints(root)
    assert reason in str(err.value)
    with pytest.raises(ModelLoadError, match=r"constraints\.json") as err2:
        LineGenerator.load(root, warmup=False)
    assert reason in str(err2.value)


def test_rows_out_of_order_and_a_table_without_vocabulary_are_refused(derived):
    doc = derived[0]
    raw = {k: (v if k == "slots" else unpack_ids(v).tolist()) for k, v in doc["bigrams"].items()}
    row = next(i for i in range(len(raw["offsets"]) - 1) if raw["offsets"][i + 1] - raw["offsets"][i] >= 2)
    nxt = list(raw["next"])
    a = raw["offsets"][row]
    nxt[a], nxt[a + 1] = nxt[a + 1], nxt[a]
    with pytest.raises(ValueError, match=r"bigrams\.next: each row must be sorted"):
        Constraints.from_json({**doc, "bigrams": {**raw, "next": nxt}})
    with pytest.raises(ValueError, match="bigrams needs a vocabulary"):
        Constraints.from_json({k: v for k, v in doc.items() if k != "vocabulary"})
