"""The line book's word trigrams: a line never strings three words together where the book never does.

The word bigrams (:mod:`runtime.client.bigrams`) keep every *pair* of words a line joins one the
book joins, and still let a model walk from one learned phrase into another mid-sentence: "I'll
count my coin on you." is made of pairs the book says, "my coin on" is not a phrase it says.
Read blind, such lines were most of the engine's garbled ones (docs/model.md). The trigram
check refuses them: a finished line with a trigram the book never says is drawn again from the
sentence before it, and falls back to an authored line when every draw has one.

What a *trigram* is (:func:`line_trigrams`, one rule for the export that derives the table, the
engines that check lines and the evaluation): a line is read as a run of *tokens* — words
(the vocabulary's: :data:`runtime.client.constraints._WORD`, lower-cased), ``{slot}`` markers, and the marks
``, ; : . ! ?`` and ``...`` (``…`` reads as ``...``) — split into *sentences*, each ending at a run of
``. ! ? ...``. Every sentence is read from a start token :data:`START`, so what may open a
sentence is one rule whether it opens the line or follows another sentence; a line whose last
sentence has no end mark gets :data:`END` after it (a line cut mid-sentence says something
the book never ends on). A trigram is three consecutive tokens of one sentence: ``"Halt! Who
goes there?"`` has ``(^, halt, !)``, ``(^, who, goes)``, ``(who, goes, there)`` and ``(goes, there, ?)``.
Other characters (hyphens, quotes, dashes) are not tokens.

:class:`TrigramTable` is what the export derives from the book's lines and ``constraints.json``
ships under the key ``trigrams``: a Bloom filter (``m`` bits, ``k`` probes from one BLAKE2b hash
of the trigram, double hashing), 8 bits a trigram, so the 35,986 trigrams of the default book
(v3.1) take 36 KB where an exact set would take several times that, and the mobile bundle keeps
to its 8 MB budget. A Bloom filter has no false negatives: every trigram of the book passes. It
has false positives (:attr:`TrigramTable.false_positive_rate`, ~2%): that share of unseen
trigrams passes too, so the check lets a few stitched lines through and never refuses a book line::

    "trigrams": {"m": 287888, "k": 6, "n": 35986, "bits": "<base64 of m / 8 bytes, bit i = byte i >> 3, bit i & 7>"}

A fine-tune adds its studio's lines to the base model's table (:meth:`TrigramTable.with_texts`:
the same ``m`` and ``k``, so the filter fills further and its false-positive rate rises).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from runtime.client.constraints import _SLOT_MARKER, _WORD

if TYPE_CHECKING:
    from runtime.tokenizer import Tokenizer

START = "^"
"""The token every sentence is read from (the line's start and the start after ``. ! ? ...``)."""
END = "$"
"""The token after a line's last sentence when it has no end mark."""
SENTENCE_ENDS = frozenset({".", "!", "?", "..."})
BITS_PER_TRIGRAM = 8.0
"""The filter's size per trigram the export writes: ~2% false positives with :data:`PROBES` probes."""
PROBES = 6

_TOKEN = re.compile(rf"{_SLOT_MARKER.pattern}|{_WORD.pattern}|\.\.\.|\u2026|[.,!?;:]", re.IGNORECASE)

Trigram = tuple[str, str, str]


def line_tokens(text: str, start: int = 0) -> list[tuple[str, int]]:
    """The tokens of ``text`` (from offset ``start``) with the offset where each ends (:data:`START`
    and :data:`END` not included): ``"Halt, {player}!"`` -> ``[("halt", 4), (",", 5), ("{player}", 14), ("!", 15)]``."""
    out = []
    for m in _TOKEN.finditer(text, start):
        tok = m.group(0)
        if tok == "\u2026":
            tok = "..."
        elif tok[0] != "{":
            tok = tok.lower()
        out.append((tok, m.end()))
    return out


class TrigramReader:
    """Reads a line's trigrams as the line grows: each :meth:`feed` reads only the text past what
    it has read, so an engine that feeds its decoded text after every token reads every token
    once (a sans-I/O state machine: the last two tokens of the sentence under way, and whether
    the last token was an end mark, so the sentence ends unless another mark follows).

    ``feed(text, final=False)``: ``text`` is the line so far (complete words only); a run of marks
    at its end, which may still grow (``.`` into ``...``, ``!`` into ``!?``), is left for the next
    feed. ``final=True``: ``text`` is the whole line; a last sentence without an end mark ends in
    :data:`END`. Each text must extend the one before. :attr:`read` is how far ``text`` was read.
    """

    def __init__(self) -> None:
        self.read = 0
        self._w1: tuple[str, int] | None = None  # the token before the last one of the sentence under way
        self._w2: tuple[str, int] = (START, 0)  # its last token (START at a sentence's start)
        self._ended = False  # the last token was an end mark

    def feed(self, text: str, *, final: bool = False) -> Iterator[tuple[Trigram, int, int]]:
        """(trigram, the end of its middle token, its end) for each trigram the text adds."""
        tokens = line_tokens(text, self.read)
        if not final:
            while tokens and not (tokens[-1][0][0].isalpha() or tokens[-1][0][0] == "{"):
                tokens.pop()
        for tok, end in tokens:
            if self._ended and tok not in SENTENCE_ENDS:
                self._w1, self._w2 = None, (START, self._w2[1])
            if self._w1 is not None:
                yield (self._w1[0], self._w2[0], tok), self._w2[1], end
            self._w1, self._w2 = self._w2, (tok, end)
            self._ended = tok in SENTENCE_ENDS
            self.read = end
        if final:
            if not self._ended and self._w1 is not None:
                yield (self._w1[0], self._w2[0], END), self._w2[1], len(text)
            self.read = len(text)


def line_trigrams(text: str) -> list[tuple[Trigram, int]]:
    """Every trigram of ``text`` (see the module docstring) with the offset where it ends (its
    last token's end; ``len(text)`` for one ending in :data:`END`), in order."""
    return [(tri, end) for tri, _cut, end in TrigramReader().feed(text, final=True)]


def _probes(tri: Trigram, m: int, k: int) -> list[int]:
    digest = hashlib.blake2b("\x1f".join(tri).encode("utf-8"), digest_size=16).digest()
    h1 = int.from_bytes(digest[:8], "little")
    h2 = int.from_bytes(digest[8:], "little") | 1
    return [(h1 + i * h2) % m for i in range(k)]


class TrigramTable:
    """The trigrams a line may hold, as a Bloom filter (see the module docstring).

    ``tri in table``: whether the table may hold it (every added trigram does; an unseen one
    with probability :attr:`false_positive_rate`). :meth:`first_unseen` is the engines' check.
    """

    def __init__(self, m: int, k: int, bits: bytes | bytearray, n: int) -> None:
        if m < 8 or m % 8:
            raise ValueError(f"trigrams: m must be a positive multiple of 8, got {m}")
        if not 1 <= k <= 32:
            raise ValueError(f"trigrams: k must be 1..32, got {k}")
        if len(bits) != m // 8:
            raise ValueError(f"trigrams: bits must be m / 8 = {m // 8} bytes, got {len(bits)}")
        if n < 0:
            raise ValueError(f"trigrams: n must be >= 0, got {n}")
        self.m, self.k, self.n = m, k, n
        self._bits = bytearray(bits)
        self._seen: dict[Trigram, bool] = {}  # answers already computed (bounded: see __contains__)

    # ------------------------------------------------------------ building

    @classmethod
    def from_texts(cls, texts: Iterable[str], bits_per_trigram: float = BITS_PER_TRIGRAM,
                   k: int = PROBES) -> TrigramTable:
        """The table of every trigram ``texts`` say, ``bits_per_trigram`` bits each."""
        grams = {tri for text in texts for tri, _ in line_trigrams(text)}
        m = max(64, math.ceil(len(grams) * bits_per_trigram / 8) * 8)
        table = cls(m, k, bytes(m // 8), 0)
        table._add(grams)
        return table

    def with_texts(self, texts: Iterable[str]) -> TrigramTable:
        """A copy of this table that also holds every trigram of ``texts`` (same ``m`` and ``k``)."""
        out = TrigramTable(self.m, self.k, self._bits, self.n)
        out._add({tri for text in texts for tri, _ in line_trigrams(text)})
        return out

    def _add(self, grams: Iterable[Trigram]) -> None:
        # n counts the trigrams the table did not already hold, judged against its bits before
        # any is added, so the count does not depend on the order of a set's iteration
        fresh = [tri for tri in grams if tri not in self]
        bits = self._bits
        for tri in fresh:
            for p in _probes(tri, self.m, self.k):
                bits[p >> 3] |= 1 << (p & 7)
        self.n += len(fresh)
        self._seen.clear()

    # ------------------------------------------------------------ reading

    def __contains__(self, tri: object) -> bool:
        if not isinstance(tri, tuple) or len(tri) != 3:
            return False
        hit = self._seen.get(tri)  # type: ignore[arg-type]
        if hit is None:
            bits = self._bits
            hit = all(bits[p >> 3] >> (p & 7) & 1 for p in _probes(tri, self.m, self.k))  # type: ignore[arg-type]
            if len(self._seen) >= 1 << 16:
                self._seen.clear()
            self._seen[tri] = hit  # type: ignore[index]
        return hit

    def first_unseen(self, text: str, *, reader: TrigramReader | None = None,
                     final: bool = True) -> tuple[Trigram, int, int] | None:
        """The first trigram of ``text`` the table does not hold, or None: ``(trigram, cut, end)``,
        ``end`` the offset where it ends (where a line that has it must be drawn again from: the
        sentence it is in), ``cut`` where its last token's text starts after the one before
        (``text[:cut]`` is the line without it). ``reader``: the :class:`TrigramReader` of a line
        being decoded (default: a fresh one, ``text`` read whole); only what it has not read yet
        is read. ``final=False``: ``text`` is the complete words of a line still being decoded
        (:meth:`TrigramReader.feed`)."""
        for tri, cut, end in (reader or TrigramReader()).feed(text, final=final):
            if tri not in self:
                return tri, cut, end
        return None

    @property
    def fill(self) -> float:
        """The share of the filter's bits that are set."""
        return int.from_bytes(self._bits, "little").bit_count() / self.m

    @property
    def false_positive_rate(self) -> float:
        """The chance an unseen trigram passes: :attr:`fill` to the power ``k``."""
        return float(self.fill ** self.k)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, TrigramTable) and (self.m, self.k, self.n) == (other.m, other.k, other.n)
                and self._bits == other._bits)

    def __repr__(self) -> str:
        return f"TrigramTable(n={self.n}, m={self.m}, k={self.k}, fp={self.false_positive_rate:.3f})"

    # ------------------------------------------------------------ the file

    def to_json(self) -> dict[str, Any]:
        """``constraints.json``'s ``trigrams`` value (:meth:`from_json` reads it back)."""
        return {"m": self.m, "k": self.k, "n": self.n, "bits": base64.b64encode(bytes(self._bits)).decode("ascii")}

    @classmethod
    def from_json(cls, data: Any) -> TrigramTable:
        """Parse ``constraints.json``'s ``trigrams``; ValueError / TypeError naming the field at fault."""
        if not isinstance(data, Mapping):
            raise TypeError("trigrams must be an object with m, k, n and bits")
        for key in ("m", "k", "n"):
            if not isinstance(data.get(key), int) or isinstance(data.get(key), bool):
                raise TypeError(f"trigrams.{key} must be an integer")
        raw = data.get("bits")
        if not isinstance(raw, str):
            raise TypeError("trigrams.bits must be a base64 string")
        try:
            bits = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"trigrams.bits is not base64 ({exc})") from exc
        return cls(data["m"], data["k"], bits, data["n"])


def tokens_through(tokenizer: Tokenizer, tokens: Sequence[int], end: int) -> int:
    """How many of ``tokens`` it takes for their text (``tokenizer.decode``) to reach character
    ``end`` (at least 1): where a line stopped at a trigram ending there is cut."""
    lo, hi = 1, len(tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(tokens[:mid])) >= end:
            hi = mid
        else:
            lo = mid + 1
    return hi


__all__ = [
    "BITS_PER_TRIGRAM",
    "END",
    "PROBES",
    "SENTENCE_ENDS",
    "START",
    "TrigramReader",
    "TrigramTable",
    "line_tokens",
    "line_trigrams",
    "tokens_through",
]
