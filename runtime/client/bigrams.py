"""The line book's word bigrams: a line never joins two words the book never joins.

A line's text is read in *sentence pieces*: the stretches between ``. ! ? , ; :`` (and ``…``).
Inside a piece, the *words* are what the vocabulary counts (lower-cased ``[a-z]+`` with at
most one inner apostrophe, :data:`runtime.client.constraints._WORD`), and every ``{slot}``
marker counts as a word too (``"the {location}"`` is a bigram). :func:`piece_words` is that one
rule, shared by the export (which derives the table from the book), the engine's masks and the
evaluation's "unseen bigram lines".

:class:`BigramTable` is what the export derives and ``constraints.json`` ships under the key
``bigrams``: for every vocabulary word and slot, the words and slots that follow it inside a
piece somewhere in the book, and the words and slots that start a piece. Ids: the vocabulary in
sorted order (``constraints.json``'s ``vocabulary`` list), then the slots in the table's
``slots`` order. The file stores it compressed-sparse-row::

    "bigrams": {"slots": ["player", ...],          # ids len(vocabulary) + k
                "starts": [id, ...],               # sorted: the words that may start a piece
                "offsets": [0, ..., len(next)],    # len(vocabulary) + len(slots) + 1 of them
                "next": [id, ...]}                 # row i: next[offsets[i]:offsets[i + 1]], sorted

Each of the three id arrays is a JSON list of integers or, as the export writes them, a packed
string ``"u16:<base64>"`` (``u32`` for ids of 65,536 and over; :func:`pack_ids`): little-endian
unsigned integers, half the bytes of the list, read the same way.

:class:`BigramMask` is the engine's part (built by
:class:`runtime.client.constraints.WordConstraint` when it is given a table): a word completed
inside a piece must be followed by one of its successors. ``WordState.prev`` holds the word
before the one being spelled (its id; :data:`PIECE` at a piece start, :data:`ANY` where nothing
is known, after a word the vocabulary does not hold). A token is blocked when

* a word it completes is not a successor of the word before it (a piece's first word: not a
  piece-start word), and likewise a slot token;
* the word it leaves being spelled can no longer become a successor: the vocabulary trie
  numbers its words in sorted order, so every trie node covers a contiguous range of ids, and a
  node is allowed iff the sorted successor array has an element in that range (one vectorised
  ``searchsorted`` over the tokens of a state); at the end of the line (the last token of the
  budget) that word must itself be a successor;
* it ends on spaces inside a piece after a word with no successor at all (only a piece mark or
  the line's end may follow such a word, and no mark may follow a space).

A piece mark resets to "any piece-start word". The line's end is no constraint (a piece may end
after any word). The masks compose with the vocabulary, phrases and text rules: a token is
blocked when either blocks it; a state the bigrams leave without a token is a dead end the
engines handle as every other (veto, redraw, fallback).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from runtime.client.constraints import (
    _APOSTROPHE,
    _BOUNDARY,
    _SLOT_CHAR,
    _SLOT_MARKER,
    _WORD,
    WordState,
    _Memo,
)

if TYPE_CHECKING:
    from runtime.client.constraints import WordConstraint

PIECE_MARKS = ".!?,;:\u2026"
"""The characters that end a sentence piece."""
PIECE = -1
"""``WordState.prev`` at a piece start (the default: a line starts a piece)."""
ANY = -2
"""``WordState.prev`` where the word before is unknown (no vocabulary word): nothing is constrained."""

_PIECE_SPLIT = re.compile("[" + re.escape(PIECE_MARKS) + "]+")
_PIECE_WORD = re.compile(_SLOT_MARKER.pattern + "|" + _WORD.pattern)


def piece_words(text: str) -> list[list[str]]:
    """The words of ``text`` per sentence piece (lower case; a slot as its ``{name}`` marker),
    pieces without a word left out: ``"Hm. The {location}, at night"`` ->
    ``[["hm"], ["the", "{location}"], ["at", "night"]]``."""
    out = []
    for piece in _PIECE_SPLIT.split(text):
        found = [m.group(0) if m.group(1) else m.group(0).lower() for m in _PIECE_WORD.finditer(_lower_words(piece))]
        if found:
            out.append(found)
    return out


def _lower_words(piece: str) -> str:
    """``piece`` lower-cased outside its slot markers (slot names keep their case)."""
    at, parts = 0, []
    for m in _SLOT_MARKER.finditer(piece):
        parts += [piece[at:m.start()].lower(), m.group(0)]
        at = m.end()
    return "".join([*parts, piece[at:].lower()])


def bigram_pairs(text: str) -> list[tuple[str, str]]:
    """Every (word, next word) of ``text`` inside one sentence piece, in order (:func:`piece_words`)."""
    return [(a, b) for ws in piece_words(text) for a, b in itertools.pairwise(ws)]


_PACKED = {"u16": np.dtype("<u2"), "u32": np.dtype("<u4")}


def pack_ids(values: np.ndarray) -> str:
    """``values`` (non-negative integers) as ``"u16:<base64>"`` (or ``u32`` when one is 65,536
    or more): little-endian unsigned integers, base64. Half the bytes of a JSON list of the
    same ids, which the mobile bundle's 8 MB budget needs; :func:`_ids` reads both forms."""
    arr = np.asarray(values, dtype=np.int64)
    kind = "u16" if not len(arr) or int(arr.max()) < 1 << 16 else "u32"
    return f"{kind}:" + base64.b64encode(arr.astype(_PACKED[kind]).tobytes()).decode("ascii")


def unpack_ids(value: str | list[int]) -> np.ndarray:
    """The ids of a ``bigrams`` field in either form (a list, or :func:`pack_ids`' string)."""
    return _unpack(value, "ids") if isinstance(value, str) else np.asarray(value, dtype=np.int64)


def _unpack(value: str, field: str) -> np.ndarray:
    kind, sep, data = value.partition(":")
    if not sep or kind not in _PACKED:
        raise ValueError(f"bigrams.{field} must be a list of integers or a packed string "
                         f"\"u16:<base64>\" / \"u32:<base64>\", got {value[:20]!r}")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"bigrams.{field}: not base64 ({exc})") from None
    if len(raw) % _PACKED[kind].itemsize:
        raise ValueError(f"bigrams.{field}: {len(raw)} bytes is not a whole number of {kind} values")
    return np.frombuffer(raw, dtype=_PACKED[kind]).astype(np.int64)


def _ids(values: Any, field: str, bound: int) -> np.ndarray:
    if isinstance(values, str):
        arr = _unpack(values, field)
    elif not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"bigrams.{field} must be a list of integers")
    else:
        arr = np.asarray(values, dtype=np.int64)
    if len(arr) and (arr.min() < 0 or arr.max() >= bound):
        raise ValueError(f"bigrams.{field}: ids must be in [0, {bound}), got {int(arr.min())}..{int(arr.max())}")
    return arr


@dataclass(frozen=True, eq=False)
class BigramTable:
    """Which words follow which inside a sentence piece, and which start one (see the module
    docstring). ``words``: the vocabulary, sorted (ids ``0..len(words)-1``); ``slots``: the slot
    names (the ids after); ``starts``: sorted ids; ``offsets``/``successors``: the rows, CSR."""

    words: tuple[str, ...]
    slots: tuple[str, ...]
    starts: np.ndarray
    offsets: np.ndarray
    successors: np.ndarray

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BigramTable):
            return NotImplemented
        return (self.words == other.words and self.slots == other.slots
                and all(np.array_equal(a, b) for a, b in zip(
                    (self.starts, self.offsets, self.successors), (other.starts, other.offsets, other.successors))))

    __hash__ = None  # type: ignore[assignment]

    @property
    def size(self) -> int:
        """How many ids there are (words and slots)."""
        return len(self.words) + len(self.slots)

    def token(self, i: int) -> str:
        """The word or ``{slot}`` marker of id ``i``."""
        return self.words[i] if i < len(self.words) else "{" + self.slots[i - len(self.words)] + "}"

    def row(self, i: int) -> np.ndarray:
        """The sorted ids that may follow id ``i`` inside a piece."""
        return self.successors[self.offsets[i]:self.offsets[i + 1]]

    def pairs(self) -> set[tuple[str, str]]:
        """Every bigram of the table, as (word or ``{slot}``, word or ``{slot}``)."""
        return {(self.token(i), self.token(int(j))) for i in range(self.size) for j in self.row(i)}

    def start_words(self) -> set[str]:
        """The words and ``{slot}`` markers that may start a piece."""
        return {self.token(int(i)) for i in self.starts}

    @classmethod
    def from_texts(cls, texts: Iterable[str], vocabulary: Iterable[str], slots: Sequence[str]) -> BigramTable:
        """The table of ``texts`` (every book line), over ``vocabulary`` and ``slots``; ValueError
        naming a word outside the vocabulary or an unknown slot (the table and the vocabulary
        must come from the same lines)."""
        words = tuple(sorted(set(vocabulary)))
        index = {w: i for i, w in enumerate(words)}
        index.update({"{" + s + "}": len(words) + k for k, s in enumerate(slots)})
        rows: list[set[int]] = [set() for _ in range(len(index))]
        starts: set[int] = set()
        for text in texts:
            for ws in piece_words(text):
                try:
                    ids = [index[w] for w in ws]
                except KeyError as exc:
                    raise ValueError(f"{exc.args[0]!r} (in {text!r}) is no vocabulary word or slot") from None
                starts.add(ids[0])
                for a, b in itertools.pairwise(ids):
                    rows[a].add(b)
        offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
        succ = np.asarray([j for r in rows for j in sorted(r)], dtype=np.int64)
        return cls(words, tuple(slots), np.asarray(sorted(starts), dtype=np.int64), offsets, succ)

    def to_json(self) -> dict[str, Any]:
        """The ``bigrams`` entry of ``constraints.json`` (the words are its ``vocabulary``)."""
        return {"slots": list(self.slots), "starts": pack_ids(self.starts), "offsets": pack_ids(self.offsets),
                "next": pack_ids(self.successors)}

    @classmethod
    def from_json(cls, data: Any, vocabulary: Iterable[str] | None, slots: Sequence[str]) -> BigramTable:
        """Parse and check the ``bigrams`` entry of ``constraints.json``; ValueError naming the
        field (``bigrams.offsets: ...``). ``vocabulary``: the file's (required: the ids are its
        words); ``slots``: the file's slots (the table's must be among them)."""
        if vocabulary is None:
            raise ValueError("bigrams needs a vocabulary (its ids are the vocabulary's words)")
        if not isinstance(data, dict):
            raise ValueError("bigrams must be an object with slots, starts, offsets and next")
        missing = [k for k in ("slots", "starts", "offsets", "next") if k not in data]
        if missing:
            raise ValueError(f"bigrams: missing {', '.join(missing)}")
        extra = sorted(set(data) - {"slots", "starts", "offsets", "next"})
        if extra:
            raise ValueError(f"bigrams: unknown key {extra[0]!r}")
        names = data["slots"]
        if not isinstance(names, list) or not all(isinstance(s, str) and s in slots for s in names) \
                or len(set(names)) != len(names):
            raise ValueError(f"bigrams.slots must list distinct slots of the file ({', '.join(slots)})")
        words = tuple(sorted(set(vocabulary)))
        size = len(words) + len(names)
        starts = _ids(data["starts"], "starts", size)
        if len(starts) and np.any(np.diff(starts) <= 0):
            raise ValueError("bigrams.starts must be sorted without repeats")
        if not len(starts):
            raise ValueError("bigrams.starts is empty: no word could start a line")
        succ = _ids(data["next"], "next", size)
        off = _ids(data["offsets"], "offsets", len(succ) + 1)
        if len(off) != size + 1:
            raise ValueError(f"bigrams.offsets must hold {size + 1} integers (one per word and slot, "
                             f"and one), got {len(off)}")
        if off[0] != 0 or off[-1] != len(succ) or np.any(np.diff(off) < 0):
            raise ValueError(f"bigrams.offsets must rise from 0 to len(next) = {len(succ)}")
        inner = np.ones(len(succ), dtype=bool)
        inner[off[1:-1][off[1:-1] < len(succ)]] = False  # (the first of each row, but for empty ones)
        if len(succ) > 1 and np.any((np.diff(succ) <= 0) & inner[1:]):
            raise ValueError("bigrams.next: each row must be sorted without repeats")
        return cls(words, tuple(names), starts, off, succ)


class BigramMask:
    """The engine's bigram masks over one :class:`runtime.client.constraints.WordConstraint`'s
    vocabulary trie and tokens (see the module docstring). :meth:`blocked` gives the tokens a
    state blocks (memoised per trie node, mode, word before and whether the token is the
    last; inside a word also per the word before's successors below the node, which is all it
    depends on there), :meth:`after` the ``prev`` of the state after a token, :meth:`blocked_exact`
    the reference, token by token. Made at load: per word before, which word-starting tokens
    can still become one of its successors (a word boundary's mask is a row of it: two bool
    tables of (words + slots + 2) x word-starting tokens, ~7.8 MB and ~9 ms for the shipped
    model's 2,679 ids and 1,448 tokens)."""

    def __init__(self, table: BigramTable, words: WordConstraint, max_states: int = 4096) -> None:
        if words.vocabulary is None:
            raise ValueError("a bigram table needs a vocabulary")
        self.table = table
        self.wc = words
        wc = words
        child_count = len(wc._child)
        is_word = np.asarray(wc._is_word, dtype=bool)
        cum = np.concatenate([[0], np.cumsum(is_word, dtype=np.int64)])
        end = np.asarray(wc._subtree_end, dtype=np.int64)
        nodes = np.arange(child_count)
        # the vocabulary's words in trie (preorder = sorted) order: node n covers ids lo..hi-1
        self._lo, self._hi = cum[nodes], cum[end]
        self._rank = np.where(is_word, cum[nodes], ANY)
        # on a pending apostrophe ("i'"), the word may end (the node's own word) or go on past
        # the apostrophe (the "'" child's range), not into the node's other children ("in")
        apos = np.asarray([c.get("'", -1) for c in wc._child], dtype=np.int64)
        self._apos_lo = np.where(apos >= 0, cum[np.maximum(apos, 0)], 0)
        self._apos_hi = np.where(apos >= 0, cum[end[np.maximum(apos, 0)]], 0)
        n_words = int(cum[-1])
        # the table's ids -> trie ids (the same order when the table's words are the trie's)
        remap = np.empty(table.size, dtype=np.int64)
        for i, w in enumerate(table.words):
            node = wc._walk(0, w)
            if node < 0 or not is_word[node]:
                raise ValueError(f"bigrams: {w!r} is not in the vocabulary")
            remap[i] = cum[node]
        if len(table.words) != n_words:
            raise ValueError(f"bigrams: {len(table.words)} words, the vocabulary has {n_words}")
        remap[len(table.words):] = n_words + np.arange(len(table.slots))
        self._starts = np.sort(remap[table.starts])
        self._starts_list: list[int] = self._starts.tolist()
        self._empty_ids = np.zeros(0, dtype=np.int64)
        self._rows: list[np.ndarray] = [self._empty_ids] * table.size
        for i in range(table.size):
            self._rows[remap[i]] = np.sort(remap[table.row(i)])
        # per token, as read whole from a word boundary (a "simple" token: it ends no word inside)
        v = wc.vocab_size
        slot_id = {name: n_words + k for k, name in enumerate(table.slots)}
        self._slot = np.full(v, ANY, dtype=np.int64)
        for tok, name in wc.tokenizer._slot_of.items():
            self._slot[tok] = slot_id.get(name, table.size)  # (a slot the table lacks: never follows)
        texts = wc._texts
        simple = np.asarray([s is not None for s in wc._whole_state], dtype=bool) | (self._slot != ANY)
        simple[wc.eos_id] = True
        self._simple = simple
        self._reset = np.asarray([any(c in PIECE_MARKS for c in t) for t in texts], dtype=bool)
        tail = wc._tail[0]
        open_ = ~wc._always & simple
        has_tail = open_ & (tail >= 0)
        self._tail_node = np.maximum(tail, 0)
        self._tail_pending = np.asarray([s is not None and s[1] == _APOSTROPHE for s in wc._whole_state], dtype=bool)
        self._with_tail = np.flatnonzero(has_tail & ~self._reset)
        self._tail_reset = np.flatnonzero(has_tail & self._reset)
        self._slots = np.flatnonzero(open_ & (self._slot != ANY))
        spaced = np.asarray([t[-1:].isspace() for t in texts], dtype=bool)
        self._dangling = np.flatnonzero(open_ & ~has_tail & ~self._reset & (self._slot == ANY) & spaced)
        self._exact = {m: wc._exact[m] for m in wc._exact}
        self._eos = wc.eos_id
        self._memo = _Memo(2 * max_states)
        self._row_lists: list[list[int] | None] = [None] * table.size
        # the ranges of every entry of the word constraint's walk table (the lead tokens of every state)
        self._walk_ranges = [self._ranges(wc._walk_reached, wc._walk_apos, last) for last in (False, True)]
        self._start_block = [self._fail(self._tail_reset, self._starts, last) for last in (False, True)]
        self._tail_ranges = [self._ranges(self._tail_node[self._with_tail], self._tail_pending[self._with_tail], last)
                             for last in (False, True)]
        # and per word before (every id, then PIECE, then a slot the table lacks), which word-starting
        # tokens can still become one of its successors: a word boundary's mask is a row of this
        # (built at load from the inverse of the ranges: [size + 2, len(_with_tail)] bools per ``last``)
        self._tail_fit = [self._fit_table(r) for r in self._tail_ranges]
        # per in-word mode: which of those can miss and end the word being spelled at their start
        self._tail_ends = {m: [can & wc._ends_mask[m][self._with_tail] for _, can in self._tail_ranges]
                           for m in wc._ends_mask}
        self._slot_ranges = self._ranges(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool), True,
                                         words=self._slot[self._slots])
        self._empty = np.zeros(0, dtype=np.int64)
        self._empty.flags.writeable = False

    # ------------------------------------------------------------ sets

    def _set(self, prev: int) -> np.ndarray | None:
        """The ids that may come next after ``prev`` (None: any)."""
        if prev == ANY:
            return None
        if prev == PIECE:
            return self._starts
        return self._rows[prev] if prev < len(self._rows) else self._empty

    @staticmethod
    def _fits(ids: np.ndarray | None, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Per range [lo, hi): whether sorted ``ids`` (None: every id) has an element in it."""
        if ids is None:
            return np.ones(len(lo), dtype=bool)
        if not len(ids):
            return np.zeros(len(lo), dtype=bool)
        j = np.searchsorted(ids, lo)
        return (j < len(ids)) & (ids[np.minimum(j, len(ids) - 1)] < hi)

    def _fail(self, toks: np.ndarray, ids: np.ndarray | None, last: bool) -> np.ndarray:
        """The tokens of ``toks`` (each starting a word from a boundary) whose word cannot become
        one of ``ids`` (at the line's end: is not one)."""
        return toks[self._misses(ids, self._tail_node[toks], self._tail_pending[toks], last)]

    def _misses(self, ids: np.ndarray | None, nodes: np.ndarray, pending: np.ndarray, last: bool) -> np.ndarray:
        """Per word being spelled (trie ``nodes``, on a ``pending`` apostrophe or not): whether
        it can no longer become one of ``ids``. At the line's end (``last``) it ends there, so it
        must be one; a word being spelled that is no word at all is the vocabulary's to block."""
        word = self._rank[nodes]
        if last:
            return (word >= 0) & ~self._fits(ids, word, word + 1)
        miss = ~self._fits(ids, self._lo[nodes], self._hi[nodes])
        if pending.any():
            at = np.flatnonzero(pending)
            n = nodes[at]
            ok = self._fits(ids, word[at], np.where(word[at] >= 0, word[at] + 1, 0))
            ok |= self._fits(ids, self._apos_lo[n], self._apos_hi[n])
            miss[at] = ~ok
        return miss

    def _ranges(self, nodes: np.ndarray, pending: np.ndarray, last: bool, *,
                words: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_misses` of ``nodes`` as ranges, so one ``searchsorted`` judges them all for any
        ``ids`` (:meth:`_missed`): (bounds [k, 4]: per word being spelled two id ranges
        ``[lo1, hi1)`` and ``[lo2, hi2)`` it can still become, the second empty but on a pending
        apostrophe; whether it can miss at all). ``words``: judge these ids themselves (each
        the range ``[w, w + 1)``) instead of ``nodes``."""
        if words is not None:
            zero = np.zeros(len(words), dtype=np.int64)
            return np.stack([words, words + 1, zero, zero], axis=1), np.ones(len(words), dtype=bool)
        word = self._rank[nodes]
        is_word = word >= 0
        zero = np.zeros(len(nodes), dtype=np.int64)
        if last:  # it ends here: it must be one of the ids (a word being spelled that is none is not judged)
            lo1 = np.where(is_word, word, 0)
            return np.stack([lo1, np.where(is_word, word + 1, 0), zero, zero], axis=1), is_word
        lo1, hi1 = self._lo[nodes].copy(), self._hi[nodes].copy()
        lo2, hi2 = zero.copy(), zero.copy()
        at = np.flatnonzero(pending)
        if len(at):  # the word ends here (its own id) or goes on past the apostrophe
            w, n = word[at], nodes[at]
            lo1[at], hi1[at] = w, np.where(w >= 0, w + 1, 0)
            lo2[at], hi2[at] = self._apos_lo[n], self._apos_hi[n]
        return np.stack([lo1, hi1, lo2, hi2], axis=1), np.ones(len(nodes), dtype=bool)

    @staticmethod
    def _holders(ranges: tuple[np.ndarray, np.ndarray], size: int) -> tuple[np.ndarray, np.ndarray]:
        """The inverse of :meth:`_ranges`' table: (positions, starts) such that
        ``positions[starts[i]:starts[i + 1]]`` are the words (positions in the table) that can
        miss and have id ``i`` in one of their ranges."""
        bounds, can = ranges
        lo = bounds[:, [0, 2]].ravel()
        n = np.where(np.repeat(can, 2), np.maximum(bounds[:, [1, 3]].ravel() - lo, 0), 0)
        pos = np.repeat(np.arange(len(can)).repeat(2), n)
        at = np.repeat(lo - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))  # each range's ids in turn
        keep = (at >= 0) & (at < size)
        at, pos = at[keep], pos[keep]
        order = np.argsort(at, kind="stable")
        starts = np.concatenate([[0], np.cumsum(np.bincount(at, minlength=size))])
        return pos[order], starts

    def _fit_table(self, ranges: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Bool [size + 2, len(ranges)]: per word before (the ids, then :data:`PIECE`, then an
        id outside the table), whether each word of ``ranges`` (:meth:`_ranges`) that can miss
        has one of that word's successors in its ranges (``~`` of it, and of those that can
        miss, is :meth:`_missed`). Every (word before, successor, holder) triple at once: the
        table's bigrams times the holders of each id (:meth:`_holders`)."""
        size = self.table.size
        pos, starts = self._holders(ranges, size)
        rows = [*self._rows, self._starts, self._empty_ids]
        lens = np.asarray([len(r) for r in rows], dtype=np.int64)
        ids = np.concatenate(rows)
        cnt = starts[ids + 1] - starts[ids]
        before = np.repeat(np.repeat(np.arange(len(rows)), lens), cnt)
        at = np.repeat(starts[ids] - (np.cumsum(cnt) - cnt), cnt) + np.arange(int(cnt.sum()))
        fit = np.zeros((size + 2, len(ranges[1])), dtype=bool)
        fit[before, pos[at]] = True
        return fit

    def _row_of(self, prev: int) -> int:
        """The row of :meth:`_fit_table` for the word before ``prev`` (not :data:`ANY`)."""
        size = self.table.size
        return prev if 0 <= prev < size else size if prev == PIECE else size + 1

    @staticmethod
    def _missed(ids: np.ndarray | None, ranges: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Per word of ``ranges`` (:meth:`_ranges`): whether sorted ``ids`` (None: every id) has
        no element in either of its ranges (and it can miss): :meth:`_misses`, in one search."""
        bounds, can = ranges
        if ids is None:
            return np.zeros(len(can), dtype=bool)
        c = np.searchsorted(ids, bounds)
        return (c[:, 1] <= c[:, 0]) & (c[:, 3] <= c[:, 2]) & can

    def _lead_ranges(self, node: int, mode: int, last: bool) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """(the lead tokens of ``node`` in ``mode``, :meth:`_ranges` of the nodes they reach):
        views of the word constraint's walk table and of its ranges, made at load."""
        lo, hi = self.wc._walk_slice.get(4 * node + mode, (0, 0))
        bounds, can = self._walk_ranges[last]
        return self.wc._walk_toks[lo:hi], (bounds[lo:hi], can[lo:hi])

    def _member(self, ids: np.ndarray | None, i: int) -> bool:
        if ids is None:
            return True
        j = int(np.searchsorted(ids, i))
        return j < len(ids) and int(ids[j]) == i

    # ------------------------------------------------------------ masks

    def blocked(self, state: WordState, last: bool) -> np.ndarray:
        """The token ids the bigrams block in ``state`` (read-only; often empty)."""
        key = (state[0], state[1], state[5], last)
        out = self._memo.peek(key)
        if out is None:
            out = self._memo.put(key, self._shared(state, last))
        return out  # type: ignore[no-any-return]

    def _shared(self, state: WordState, last: bool) -> np.ndarray:
        """:meth:`_make`, shared inside a word by every word before with the same successors
        below the word being spelled: there, what is blocked depends on the word before only
        through those (every lead reaches a node below, and the word's own id is one of them),
        so the mask is also kept by (node, mode, those successors, last)."""
        node, mode, prev = state[0], state[1], state[5]
        if mode == _BOUNDARY or node < 0 or prev == ANY or len(self._exact[mode]):
            return self._make(state, last)
        row = self._row_list(prev)
        lo, hi = int(self._lo[node]), int(self._hi[node])
        key = ("below", node, mode, tuple(row[bisect.bisect_left(row, lo):bisect.bisect_left(row, hi)]), last)
        out = self._memo.peek(key)
        if out is None:
            out = self._memo.put(key, self._make(state, last))
        return out  # type: ignore[no-any-return]

    def _follows(self, prev: int, i: int) -> bool:
        """Whether id ``i`` may follow ``prev`` (:meth:`_member` of its :meth:`_set`, on its list)."""
        if prev == ANY:
            return True
        row = self._row_list(prev)
        j = bisect.bisect_left(row, i)
        return j < len(row) and row[j] == i

    def _row_list(self, prev: int) -> list[int]:
        """:meth:`_set` of ``prev`` (not :data:`ANY`) as a list, made once per word."""
        if prev == PIECE:
            return self._starts_list
        if not 0 <= prev < len(self._rows):
            return []
        out = self._row_lists[prev]
        if out is None:
            out = self._row_lists[prev] = self._rows[prev].tolist()
        return out

    def _make(self, state: WordState, last: bool) -> np.ndarray:
        node, mode, prev = state[0], state[1], state[5]
        parts = self._in_word(node, mode, prev, last) if mode != _BOUNDARY else self._at_boundary(prev, last)
        exact = self._exact[mode]
        if len(exact):
            parts.append(np.asarray([t for t in exact.tolist() if self._walk(state, t, last, True)[0]],
                                    dtype=np.int64))
        parts = [x for x in parts if len(x)]
        if not parts:
            return self._empty
        # (an index array: its order and repeats do not matter to a mask, so the parts are joined)
        out = parts[0] if len(parts) == 1 else np.concatenate(parts)
        out.flags.writeable = False
        return out

    def _at_boundary(self, prev: int, last: bool) -> list[np.ndarray]:
        """The simple tokens blocked at a word boundary after ``prev``."""
        ids = self._set(prev)
        parts = [self._start_block[last]]
        if ids is not None:
            can = self._tail_ranges[last][1]
            parts += [self._with_tail[can & ~self._tail_fit[last][self._row_of(prev)]], *self._others(ids, last)]
        return parts

    def _others(self, ids: np.ndarray, last: bool) -> list[np.ndarray]:
        """The slot tokens and the tokens ending on spaces that a word boundary blocks before
        ``ids`` (:meth:`_at_boundary`'s tokens that start no word)."""
        parts = []
        if len(self._slots):
            parts.append(self._slots[self._missed(ids, self._slot_ranges)])
        if not len(ids) and not last:
            parts.append(self._dangling)
        return parts

    def _in_word(self, node: int, mode: int, prev: int, last: bool) -> list[np.ndarray]:
        """The tokens blocked inside a word (trie ``node``, ``mode``) after ``prev``: letters that
        lead where no successor is, and the tokens ending a word that is none."""
        if node < 0:
            return []
        ids = self._set(prev)
        toks, ranges = self._lead_ranges(node, mode, last)
        parts = []
        if len(toks):
            parts.append(toks[self._missed(ids, ranges)])
        word = int(self._rank[node])
        if word >= 0:  # (else the vocabulary blocks every token ending it)
            ends = self.wc._ends[mode]
            parts.append(self._ends_after(word, mode, last) if self._follows(prev, word) else ends)
        return parts

    def _ends_after(self, word: int, mode: int, last: bool) -> np.ndarray:
        """The tokens ending a word (in ``mode``) that the bigrams block after that word, ``word``
        (those that start a word which may not follow it), kept per word: the word-end tokens
        of a word boundary's mask after ``word`` (:meth:`_at_boundary`), from its row of the
        table made at load."""
        key = ("ends", mode, word, last)
        out = self._memo.peek(key)
        if out is None:
            out = self._memo.put(key, self._make_ends(word, mode, last))
        return out  # type: ignore[no-any-return]

    def _make_ends(self, word: int, mode: int, last: bool) -> np.ndarray:
        ends = self.wc._ends_mask[mode]
        if len(self._exact[_BOUNDARY]):  # (tokens read out one by one: the boundary's whole mask)
            after = self.blocked(WordState(prev=word), last)
            hit = after[ends[after]]
        else:
            parts = [self._with_tail[self._tail_ends[mode][last] & ~self._tail_fit[last][self._row_of(word)]]]
            parts += [x[ends[x]] for x in self._others(self._set(word), last) if len(x)]  # type: ignore[arg-type]
            start = self._start_block[last]
            if len(start):
                parts.append(start[ends[start]])
            hit = _joined_ids(parts)
        hit.flags.writeable = False
        return hit

    # ------------------------------------------------------------ steps and the reference

    def after(self, before: WordState, token: int, new: WordState) -> WordState:
        """``new`` (the state ``WordConstraint`` reads after ``token`` in ``before``) with its
        ``prev``: unchanged inside a word, the word ended (or the slot, or :data:`PIECE` after
        a piece mark) otherwise."""
        prev, mode = before[5], before[1]
        if token == self._eos:  # (the line ends: the state reads on unchanged, as WordConstraint's does)
            return new if prev == new[5] else WordState(*new[:5], prev)
        if mode != _BOUNDARY:
            if self.wc._lead_step[mode][token] is not None:
                return new if prev == new[5] else WordState(*new[:5], prev)
            if not self.wc._ends_list[mode][token]:
                return new._replace(prev=self._walk(before, token, False, False)[1])
            prev = int(self._rank[before[0]]) if before[0] >= 0 else ANY
        elif not self._simple[token]:
            return new._replace(prev=self._walk(before, token, False, False)[1])
        slot = int(self._slot[token])
        if slot != ANY:
            prev = slot
        elif self._reset[token]:
            prev = PIECE
        return new if prev == new[5] else WordState(*new[:5], prev)

    def _walk(self, state: WordState, token: int, final: bool, check: bool) -> tuple[bool, int]:
        """The reference reader: (whether the bigrams block ``token`` in ``state``, the ``prev``
        after it), reading its text one character at a time (``final``: the line ends after it)."""
        wc = self.wc
        node, mode, prev = state[0], state[1], state[5]
        text = wc._texts[token]
        for c in text:
            nxt = wc._read(WordState(node, mode), c, False)[0]
            if mode != _BOUNDARY and nxt.mode == _BOUNDARY:  # c ended a word
                word = int(self._rank[node]) if node >= 0 else ANY
                if check and word >= 0 and not self._member(self._set(prev), word):
                    return True, prev
                prev = word
            node, mode = nxt.node, nxt.mode
            if c == _SLOT_CHAR:
                slot = int(self._slot[token])
                if check and not self._member(self._set(prev), slot):
                    return True, prev
                prev = slot
            elif c in PIECE_MARKS:
                prev = PIECE
        if not check:
            return False, prev
        if final or token == wc.eos_id:
            word = int(self._rank[node]) if mode != _BOUNDARY and node >= 0 else ANY
            return word >= 0 and not self._member(self._set(prev), word), prev
        if mode != _BOUNDARY:
            if node < 0:
                return False, prev
            at = np.asarray([node])
            return bool(self._misses(self._set(prev), at, np.asarray([mode == _APOSTROPHE]), False)[0]), prev
        ids = self._set(prev)
        dangling = text[-1:].isspace() and ids is not None and not len(ids)
        return bool(dangling), prev

    def blocked_exact(self, state: WordState, last: bool) -> np.ndarray:
        """Bool mask [vocab]: :meth:`blocked` token by token with the reference reader (slow);
        tokens the word constraints always block are left out."""
        mask = np.zeros(self.wc.vocab_size, dtype=bool)
        for t in range(self.wc.vocab_size):
            if not self.wc._always[t]:
                mask[t] = self._walk(state, t, last, True)[0]
        return mask


def _joined_ids(parts: Sequence[np.ndarray]) -> np.ndarray:
    """``parts`` as one new index array."""
    return np.concatenate(parts) if len(parts) > 1 else parts[0].copy()


def table_of(data: Mapping[str, Any], vocabulary: Iterable[str] | None, slots: Sequence[str]) -> BigramTable | None:
    """The :class:`BigramTable` of a ``constraints.json`` document (None without the key)."""
    raw = data.get("bigrams")
    return None if raw is None else BigramTable.from_json(raw, vocabulary, slots)


__all__ = ["ANY", "PIECE", "PIECE_MARKS", "BigramMask", "BigramTable", "bigram_pairs", "pack_ids", "piece_words",
           "table_of", "unpack_ids"]
