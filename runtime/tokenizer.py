"""Byte-level BPE tokenizer for Flash lines, with control tokens for the prompt.

Pure Python (stdlib only), so a game client needs nothing extra to encode prompts and
decode lines. The JSON file and the algorithms are specified in ``docs/tokenizer.md``
precisely enough to reimplement in another language. In short:

* ids ``0 .. n_control-1`` are control tokens: ``<pad> <bos> <eos> <line>``, one slot token
  per free-text slot (``<slot:player>``), then ``<arch:X>``, ``<persona:T>``, ``<state:S>``,
  ``<intent:I>`` and ``<ctx:slot=value>`` in catalog order;
* the next 256 ids are the bytes ``0x00 .. 0xFF``;
* every further id is a merge of two earlier ids, in training order (lower id = higher
  priority), so any text, whatever its Unicode, encodes losslessly.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from pathlib import Path

FORMAT = "flashnpc-bpe"
VERSION = 1
MAX_VOCAB = 4096
SPECIAL = ("<pad>", "<bos>", "<eos>", "<line>")

# Pre-tokenization: ASCII character classes only, so every language's regex engine agrees.
_WS = r" \t\n\r\f\v"
PRETOKENIZE_PATTERN = (
    r"'(?:s|t|re|ve|m|ll|d)"
    r"| ?[A-Za-z]+"
    r"| ?[0-9]+"
    rf"| ?[^{_WS}A-Za-z0-9]+"
    rf"|[{_WS}]+(?![^{_WS}])"
    rf"|[{_WS}]+"
)
_PRETOKENIZE_RE = re.compile(PRETOKENIZE_PATTERN)
_SLOT_MARKER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def pretokenize(text: str) -> list[str]:
    """Split text into the chunks BPE works within (merges never cross a chunk)."""
    return _PRETOKENIZE_RE.findall(text)


def bytes_to_units() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, used only to make the JSON ``tokens`` readable."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    units = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in units:
            units[b] = chr(256 + n)
            n += 1
    return units


def control_tokens(catalog: Mapping) -> list[str]:
    """The control tokens for a catalog (LineBook.catalog()), in id order."""
    tokens = list(SPECIAL)
    tokens += [f"<slot:{s}>" for s in catalog["slots"]]
    tokens += [f"<arch:{a}>" for a in catalog["archetypes"]]
    tokens += [f"<persona:{p}>" for p in catalog["persona_traits"]]
    tokens += [f"<state:{s}>" for s in catalog["states"]]
    tokens += [f"<intent:{i}>" for i in catalog["intents"]]
    tokens += [f"<ctx:{slot}={v}>" for slot, values in catalog["context"].items() for v in values]
    return tokens


def _closest_first(value: str, known: Sequence[str]) -> list[str]:
    import difflib

    close = difflib.get_close_matches(value, list(known), n=len(known), cutoff=0.0)
    return close + [k for k in known if k not in close]


def _unknown(kind: str, value: object, known: Sequence[str]) -> ValueError:
    return ValueError(
        f"unknown {kind} {value!r}; known: {', '.join(_closest_first(str(value), known))}"
    )


def check_request(
    catalog: Mapping,
    archetype: str,
    persona: Sequence[str] | str,
    state: str,
    intent: str,
    context: Mapping[str, str] | Iterable[tuple[str, str]] = (),
) -> tuple[list[str], dict[str, str]]:
    """Validate a line request against a catalog; return (sorted unique persona traits, context).

    Unknown values raise ValueError listing the known values, closest match first; a context
    slot given twice with different values is an error.
    """
    cat = catalog
    if archetype not in cat["archetypes"]:
        raise _unknown("archetype", archetype, cat["archetypes"])
    if isinstance(persona, str):
        persona = [persona]
    traits = sorted(set(persona))
    for trait in traits:
        if trait not in cat["persona_traits"]:
            raise _unknown("persona trait", trait, cat["persona_traits"])
    if state not in cat["states"]:
        raise _unknown("state", state, cat["states"])
    if intent not in cat["intents"]:
        raise _unknown("intent", intent, cat["intents"])
    pairs = list(context.items()) if isinstance(context, Mapping) else list(context)
    values: dict[str, str] = {}
    for pair in pairs:
        slot, value = pair
        if slot not in cat["context"]:
            raise _unknown("context slot", slot, list(cat["context"]))
        if value not in cat["context"][slot]:
            raise _unknown(f"value for context slot {slot!r}", value, cat["context"][slot])
        if slot in values and values[slot] != value:
            raise ValueError(f"context slot {slot!r} given twice ({values[slot]!r}, {value!r})")
        values[slot] = value
    return traits, values


class Tokenizer:
    """Encodes lines and prompts to ids and decodes ids to lines.

    ``encode`` / ``decode`` handle plain line text; ``encode_prompt`` builds the model prompt.
    """

    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int
    line_id: int

    def __init__(self, catalog: Mapping, merges: Sequence[tuple[int, int]]) -> None:
        self.catalog = {
            "archetypes": list(catalog["archetypes"]),
            "persona_traits": list(catalog["persona_traits"]),
            "states": list(catalog["states"]),
            "intents": list(catalog["intents"]),
            "context": {k: list(v) for k, v in catalog["context"].items()},
            "slots": list(catalog["slots"]),
        }
        self.controls = control_tokens(self.catalog)
        self.n_control = len(self.controls)
        self.byte_offset = self.n_control
        self._control_id = {t: i for i, t in enumerate(self.controls)}
        if len(self._control_id) != self.n_control:
            raise ValueError("catalog names collide: control tokens must be unique")
        self.merges = [(int(a), int(b)) for a, b in merges]
        self._bytes: list[bytes] = [b""] * self.n_control + [bytes([b]) for b in range(256)]
        self._rank: dict[tuple[int, int], int] = {}
        for i, (a, b) in enumerate(self.merges):
            new_id = self.byte_offset + 256 + i
            if not (self.byte_offset <= a < new_id and self.byte_offset <= b < new_id):
                raise ValueError(
                    f"merge {i} ({a}, {b}) refers to an id that is not a byte or an earlier merge"
                )
            if (a, b) in self._rank:
                raise ValueError(f"merge {i} ({a}, {b}) is a duplicate")
            self._rank[(a, b)] = new_id
            self._bytes.append(self._bytes[a] + self._bytes[b])
        self.vocab_size = len(self._bytes)
        if self.vocab_size > MAX_VOCAB:
            raise ValueError(f"vocabulary of {self.vocab_size} exceeds the maximum {MAX_VOCAB}")
        self.pad_id, self.bos_id, self.eos_id, self.line_id = (self._control_id[t] for t in SPECIAL)
        self._slot_id = {s: self._control_id[f"<slot:{s}>"] for s in self.catalog["slots"]}
        self._slot_of = {i: s for s, i in self._slot_id.items()}
        self._cache: dict[str, list[int]] = {}

    # ------------------------------------------------------------ lookups

    def id_of(self, token: str) -> int:
        """The id of a control token such as ``"<state:alert>"``."""
        try:
            return self._control_id[token]
        except KeyError:
            raise _unknown("control token", token, self.controls) from None

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a text token stands for (b"" for control tokens)."""
        return self._bytes[token_id]

    def is_control(self, token_id: int) -> bool:
        return 0 <= token_id < self.n_control

    # ------------------------------------------------------------ text

    def _encode_chunk(self, chunk: str) -> list[int]:
        cached = self._cache.get(chunk)
        if cached is not None:
            return cached
        ids = [self.byte_offset + b for b in chunk.encode("utf-8")]
        rank = self._rank
        while len(ids) > 1:
            best = None
            for pair in pairwise(ids):
                r = rank.get(pair)
                if r is not None and (best is None or r < best):
                    best = r
            if best is None:
                break
            a, b = self.merges[best - self.byte_offset - 256]
            ids = _merge_pair(ids, a, b, best)
        if len(self._cache) > 100_000:
            self._cache.clear()
        self._cache[chunk] = ids
        return ids

    def _encode_plain(self, text: str) -> list[int]:
        out: list[int] = []
        for chunk in pretokenize(text):
            out.extend(self._encode_chunk(chunk))
        return out

    def encode(self, text: str) -> list[int]:
        """Line text to ids. ``{player}`` (any catalog slot) becomes one slot token; other text,
        including unknown ``{markers}`` and any Unicode, is byte-level BPE."""
        out: list[int] = []
        pos = 0
        for m in _SLOT_MARKER_RE.finditer(text):
            slot_id = self._slot_id.get(m.group(1))
            if slot_id is None:
                continue
            out.extend(self._encode_plain(text[pos : m.start()]))
            out.append(slot_id)
            pos = m.end()
        out.extend(self._encode_plain(text[pos:]))
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """Ids to text: control tokens dropped, slot tokens written back as ``{player}``,
        invalid UTF-8 replaced with U+FFFD."""
        parts: list[str] = []
        buf = bytearray()
        for raw in ids:
            i = int(raw)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
            if i >= self.n_control:
                buf += self._bytes[i]
            elif i in self._slot_of:
                parts.append(buf.decode("utf-8", errors="replace"))
                buf.clear()
                parts.append("{" + self._slot_of[i] + "}")
        parts.append(buf.decode("utf-8", errors="replace"))
        return "".join(parts)

    # ------------------------------------------------------------ prompts

    def encode_prompt(
        self,
        archetype: str,
        persona: Sequence[str],
        state: str,
        intent: str,
        context: Mapping[str, str] | Iterable[tuple[str, str]] = (),
    ) -> tuple[list[int], int]:
        """The prompt ids and the length of its cacheable prefix.

        Layout: ``<bos> <arch:A> <persona:P>... <state:S> <intent:I> <ctx:k=v>... <line>``;
        persona sorted by name (duplicates dropped), context in catalog slot order (slots may be
        omitted). ``ids[:prefix_len]`` (bos, archetype, persona, state) is the same for every
        request with that prefix. Unknown values raise ValueError listing the known values,
        closest match first.
        """
        cat = self.catalog
        traits, values = check_request(cat, archetype, persona, state, intent, context)
        ids = [self.bos_id, self._control_id[f"<arch:{archetype}>"]]
        ids += [self._control_id[f"<persona:{t}>"] for t in traits]
        ids.append(self._control_id[f"<state:{state}>"])
        prefix_len = len(ids)
        ids.append(self._control_id[f"<intent:{intent}>"])
        ids += [self._control_id[f"<ctx:{s}={values[s]}>"] for s in cat["context"] if s in values]
        ids.append(self.line_id)
        return ids, prefix_len

    # ------------------------------------------------------------ files

    def to_json(self) -> dict:
        units = bytes_to_units()
        tokens = list(self.controls) + [
            "".join(units[b] for b in self._bytes[i])
            for i in range(self.n_control, self.vocab_size)
        ]
        return {
            "format": FORMAT,
            "version": VERSION,
            "pretokenize": PRETOKENIZE_PATTERN,
            "catalog": self.catalog,
            "controls": list(self.controls),
            "byte_offset": self.byte_offset,
            "merges": [list(m) for m in self.merges],
            "vocab_size": self.vocab_size,
            "tokens": tokens,
        }

    def save(self, path: str | Path) -> None:
        """Write the tokenizer as JSON (see docs/tokenizer.md)."""
        Path(path).write_text(
            json.dumps(self.to_json(), ensure_ascii=False, indent=1) + "\n", encoding="utf-8"
        )

    @classmethod
    def from_json(cls, data: Mapping) -> Tokenizer:
        if data.get("format") != FORMAT or data.get("version") != VERSION:
            raise ValueError(
                f"not a {FORMAT} v{VERSION} tokenizer (format={data.get('format')!r}, version={data.get('version')!r})"
            )
        tok = cls(data["catalog"], [tuple(m) for m in data["merges"]])
        if list(data["controls"]) != tok.controls or data["byte_offset"] != tok.byte_offset:
            raise ValueError("tokenizer JSON: controls/byte_offset do not match its catalog")
        if data.get("vocab_size", tok.vocab_size) != tok.vocab_size:
            raise ValueError("tokenizer JSON: vocab_size does not match its merges")
        return tok

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Read a tokenizer written by :meth:`save` (a file, or a model directory holding tokenizer.json)."""
        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        return cls.from_json(json.loads(p.read_text(encoding="utf-8")))


def _slot_free_segments(text: str, slots: set[str]) -> Iterable[str]:
    pos = 0
    for m in _SLOT_MARKER_RE.finditer(text):
        if m.group(1) in slots:
            yield text[pos : m.start()]
            pos = m.end()
    yield text[pos:]


def train_tokenizer(texts: Iterable[str], catalog: Mapping, vocab_size: int = 2048) -> Tokenizer:
    """Train byte-level BPE on ``texts`` up to ``vocab_size`` tokens in all (controls included).

    Deterministic: each step merges the most frequent adjacent pair within the pre-tokenized
    chunks, ties broken by the smaller left id, then the smaller right id. Training stops early
    when no pair occurs at least twice.
    """
    if vocab_size > MAX_VOCAB:
        raise ValueError(f"vocab_size {vocab_size} exceeds the maximum {MAX_VOCAB}")
    n_control = len(control_tokens(catalog))
    n_merges = vocab_size - n_control - 256
    if n_merges < 0:
        raise ValueError(f"vocab_size {vocab_size} is below controls + bytes = {n_control + 256}")
    slots = set(catalog["slots"])
    chunk_counts: Counter[str] = Counter()
    for text in texts:
        for segment in _slot_free_segments(text, slots):
            chunk_counts.update(pretokenize(segment))
    offset = n_control
    words: list[list[int]] = []
    freqs: list[int] = []
    for chunk, count in sorted(chunk_counts.items()):
        words.append([offset + b for b in chunk.encode("utf-8")])
        freqs.append(count)
    pair_counts: Counter[tuple[int, int]] = Counter()
    where: dict[tuple[int, int], set[int]] = {}
    for wi, word in enumerate(words):
        for pair in pairwise(word):
            pair_counts[pair] += freqs[wi]
            where.setdefault(pair, set()).add(wi)
    merges: list[tuple[int, int]] = []
    while len(merges) < n_merges and pair_counts:
        best = max(pair_counts, key=lambda p: (pair_counts[p], -p[0], -p[1]))
        if pair_counts[best] < 2:
            break
        new_id = offset + 256 + len(merges)
        merges.append(best)
        a, b = best
        for wi in sorted(where.pop(best, ())):
            word, f = words[wi], freqs[wi]
            for pair in pairwise(word):
                pair_counts[pair] -= f
                if pair_counts[pair] <= 0:
                    del pair_counts[pair]
                if pair != best and pair in where:
                    where[pair].discard(wi)
            merged = _merge_pair(word, a, b, new_id)
            words[wi] = merged
            for pair in pairwise(merged):
                pair_counts[pair] += f
                where.setdefault(pair, set()).add(wi)
        pair_counts.pop(best, None)
    return Tokenizer(catalog, merges)


def _merge_pair(ids: list[int], a: int, b: int, new: int) -> list[int]:
    """``ids`` with every non-overlapping (a, b), left to right, replaced by ``new``."""
    merged: list[int] = []
    i, n = 0, len(ids)
    while i < n:
        if i + 1 < n and ids[i] == a and ids[i + 1] == b:
            merged.append(new)
            i += 2
        else:
            merged.append(ids[i])
            i += 1
    return merged
