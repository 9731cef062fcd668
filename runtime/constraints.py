"""Constraints on a generated line: banned words at the token level, slot filling, repeat memory.

Banned words are blocked while sampling, never filtered afterwards. A word is what
:func:`runtime.text_metrics.banned_hits` calls a word (lower-cased ``[a-z]+`` with an inner
apostrophe); a banned entry may be a phrase (``"train station"``): its words must follow one
another, whatever punctuation sits between them. :class:`BannedWordMask` walks the text a
candidate token would add from the current state (the partial word being spelled and the
banned phrases under way) and blocks the token if it would *complete* a banned word at a word
boundary. A token that ends exactly on a banned word (``" car"``) is allowed, because the next
token may still extend it (``"t"`` -> ``"cart"``); the next token is then only allowed if it
keeps spelling letters, and ``eos`` and the last token of the budget count as a boundary.

Masks depend only on that small state, so each state's mask over the whole vocabulary is
computed once (a few milliseconds) and memoised; a decode step costs one dictionary lookup.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from runtime.tokenizer import Tokenizer

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")
_SLOT_MARKER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_DEAD = "\x00"  # the partial word can no longer become a banned word


def _is_letter(c: str) -> bool:
    return "a" <= c <= "z"


@dataclass(frozen=True)
class WordState:
    """Where the text stands for banned-word purposes.

    ``partial``: the word being spelled (lower case, possibly with an apostrophe), ``""`` at a
    boundary, or a marker meaning it cannot become banned. ``phrases``: for each banned phrase
    under way, ``(phrase index, words matched so far)``.
    """

    partial: str = ""
    phrases: frozenset[tuple[int, int]] = frozenset()


class BannedWordMask:
    """Token masks that keep banned words and phrases out of generated text.

    ``words``: banned words or phrases (case-insensitive). ``tokenizer``: the model's
    tokenizer. Always blocked too: control tokens other than ``eos`` and slot tokens, and tokens
    holding ASCII control characters (newline, tab, ...) or braces: none has a place inside a line.
    """

    def __init__(self, words: Iterable[str], tokenizer: Tokenizer) -> None:
        phrases = []
        for w in words:
            parts = tuple(_WORD.findall(w.lower()))
            if parts and parts not in phrases:
                phrases.append(parts)
        self.phrases: list[tuple[str, ...]] = phrases
        self._single = {p[0] for p in phrases if len(p) == 1}
        self._multi = [p for p in phrases if len(p) > 1]
        prefixes = set()
        for p in phrases:
            for word in p:
                for i in range(1, len(word) + 1):
                    prefixes.add(word[:i])
        self._prefixes = prefixes
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.eos_id = tokenizer.eos_id
        self._texts: list[str] = []
        self._always_blocked = np.zeros(self.vocab_size, dtype=bool)
        for i in range(self.vocab_size):
            if i < tokenizer.n_control:
                slot = tokenizer._slot_of.get(i)
                self._texts.append("{" + slot + "}" if slot else "")
                self._always_blocked[i] = slot is None and i != self.eos_id
            else:
                # bytes >= 0x80 never spell [a-z]: latin-1 keeps one char per byte
                raw = tokenizer.token_bytes(i)
                self._texts.append(raw.decode("latin-1").lower())
                # ASCII control characters (newlines included) have no place in a subtitle, and
                # braces only come as slot tokens (a spelled-out "{player}" would bypass slot rules)
                self._always_blocked[i] = any(b < 0x20 or b == 0x7F for b in raw) or b"{" in raw or b"}" in raw
        self._memo: dict[tuple[WordState, bool], np.ndarray] = {}
        self._lock = threading.Lock()
        self._index_leads()

    def _index_leads(self) -> None:
        """Split every token into its *lead* (the letters that extend the word being spelled) and
        the *rest*, and tabulate whether the rest alone, read from a word boundary, completes a
        banned word. Variant 0 is for a token read at a boundary, 1 inside a word (where a
        leading apostrophe continues the word)."""
        self._groups: list[dict[str, list[int]]] = [{}, {}]
        self._rest_empty = [np.zeros(self.vocab_size, dtype=bool) for _ in range(2)]
        self._rest_bad = [[np.zeros(self.vocab_size, dtype=bool) for _ in range(2)] for _ in range(2)]
        root = WordState()
        rest_memo: dict[tuple[str, bool], bool] = {}
        for i, text in enumerate(self._texts):
            if self._always_blocked[i] or i == self.eos_id or not text:
                continue
            for v in (0, 1):
                n = 0
                while n < len(text) and (_is_letter(text[n]) or (text[n] == "'" and (v or n))):
                    n += 1
                lead, rest = text[:n], text[n:]
                self._groups[v].setdefault(lead.rstrip("'"), []).append(i)
                self._rest_empty[v][i] = not rest
                for last in (False, True):
                    if rest:
                        key = (rest, last)
                        if key not in rest_memo:
                            rest_memo[key] = self.advance(root, rest, final=last) is None
                        self._rest_bad[v][last][i] = rest_memo[key]

    # ------------------------------------------------------------ state machine

    def _word_done(self, word: str, phrases: frozenset[tuple[int, int]]
                   ) -> tuple[bool, frozenset[tuple[int, int]]]:
        """A word ended: (is a banned word or phrase now complete, phrases under way after it)."""
        word = word.strip("'")
        if not word:
            return False, phrases
        if word in self._single:
            return True, frozenset()
        nxt = set()
        for idx, n in (*phrases, *((i, 0) for i in range(len(self._multi)))):
            p = self._multi[idx]
            if p[n] == word:
                if n + 1 == len(p):
                    return True, frozenset()
                nxt.add((idx, n + 1))
        return False, frozenset(nxt)

    def advance(self, state: WordState, text: str, *, final: bool = False) -> WordState | None:
        """The state after ``text`` is appended, or None if that completes a banned word.

        ``final``: the text ends the line, so a word still being spelled ends too.
        """
        partial, phrases = state.partial, state.phrases
        for c in text.lower():
            if _is_letter(c) or (c == "'" and partial not in ("",)):
                if partial != _DEAD:
                    partial += c
                    if partial.strip("'") not in self._prefixes and partial.strip("'"):
                        partial = _DEAD
                continue
            if partial:
                if partial != _DEAD:
                    banned, phrases = self._word_done(partial, phrases)
                    if banned:
                        return None
                else:
                    phrases = frozenset()
                partial = ""
        if final and partial:
            if partial != _DEAD:
                banned, phrases = self._word_done(partial, phrases)
                if banned:
                    return None
            partial = ""
        return WordState(partial, phrases)

    def blocked(self, state: WordState, *, last: bool = False) -> np.ndarray:
        """Bool mask [vocab]: True where the token must not be sampled in ``state``.

        ``last``: the next token is the last of the budget (its end is the end of the line).
        The returned array is shared and read-only.
        """
        key = (state, last)
        mask = self._memo.get(key)
        if mask is not None:
            return mask
        mask = self._compute(state, last)
        mask.flags.writeable = False
        with self._lock:
            if len(self._memo) > 4096:  # pathological texts only; states are normally few
                self._memo.clear()
            self._memo[key] = mask
        return mask

    def _compute(self, state: WordState, last: bool) -> np.ndarray:
        """The mask for a state, reading only the tokens whose lead may matter.

        A token whose lead turns the word being spelled into something that is no banned word's
        prefix ends that word harmlessly, so only its rest matters, which is tabulated; the few
        tokens whose lead keeps a banned prefix alive are read out in full with :meth:`advance`.
        """
        p = state.partial
        v = 1 if p else 0
        mask = self._always_blocked | self._rest_bad[v][last]
        mask[self.eos_id] = self.advance(state, "", final=True) is None
        exact: list[int] = []
        if p != _DEAD:
            groups = self._groups[v]
            for pre in self._prefixes:
                if pre.startswith(p) and len(pre) > len(p):
                    exact += groups.get(pre[len(p):], ())
            boundary = groups.get("", ())
            if p:
                # the word p ends at these tokens' first character
                banned, phrases = self._word_done(p, state.phrases)
                if banned:
                    idx = np.asarray(boundary, dtype=np.int64)
                    mask[idx] = ~self._rest_empty[v][idx] | last
                elif phrases:
                    exact += boundary
            elif state.phrases:
                exact += boundary
        for i in exact:
            mask[i] = self.advance(state, self._texts[i], final=last) is None
        return mask

    def precompute(self) -> int:
        """Compute the masks of every state without a banned phrase under way (a boundary, a dead
        word, each banned-word prefix), so decoding never waits on one; returns how many."""
        states = [WordState(), WordState(_DEAD), *(WordState(p) for p in sorted(self._prefixes))]
        for st in states:
            for last in (False, True):
                self.blocked(st, last=last)
        return 2 * len(states)

    def blocked_exact(self, state: WordState, *, last: bool = False) -> np.ndarray:
        """:meth:`blocked` computed token by token with :meth:`advance` (the reference; slow)."""
        mask = self._always_blocked.copy()
        for i, text in enumerate(self._texts):
            if mask[i]:
                continue
            if i == self.eos_id:
                mask[i] = self.advance(state, "", final=True) is None
            elif text:
                mask[i] = self.advance(state, text, final=last) is None
        return mask

    def step(self, state: WordState, token_id: int) -> WordState:
        """The state after ``token_id`` was emitted (the token must not have been blocked)."""
        new = self.advance(state, self._texts[token_id])
        return new if new is not None else WordState(_DEAD)


def fill_slots(text: str, values: Mapping[str, str]) -> str:
    """Replace ``{slot}`` markers with ``values[slot]``; markers without a value stay.

    A value that starts a sentence (the line, or after ``.``, ``!`` or ``?``) gets a capital
    first letter: "the barracks" at the start reads "The barracks is...".
    """

    def fill(m: re.Match[str]) -> str:
        value = values.get(m.group(1))
        if value is None:
            return m.group(0)
        value = str(value)
        if re.search(r"(^|[.!?]\s+)$", text[: m.start()]):
            value = value[:1].upper() + value[1:]
        return value

    return _SLOT_MARKER.sub(fill, text)


def unfilled_slots(text: str) -> set[str]:
    """Names of ``{slot}`` markers left in ``text``."""
    return set(_SLOT_MARKER.findall(text))


def normalise_line(text: str) -> str:
    """The form lines are compared in by the repeat memory: lower case, words only."""
    return " ".join(re.findall(r"\w+", text.lower()))


class RepeatMemory:
    """The last ``size`` lines said per key (an NPC and a player), for repeat avoidance.

    Lines are compared after :func:`normalise_line`. At most ``max_keys`` keys are kept, the
    least recently used dropped first. Thread-safe.
    """

    def __init__(self, size: int = 8, max_keys: int = 10_000) -> None:
        if size < 0 or max_keys < 1:
            raise ValueError(f"size must be >= 0 and max_keys >= 1, got {size}, {max_keys}")
        self.size = size
        self.max_keys = max_keys
        self._lines: OrderedDict[object, deque[str]] = OrderedDict()
        self._lock = threading.Lock()

    def said_recently(self, key: object, text: str) -> bool:
        norm = normalise_line(text)
        with self._lock:
            lines = self._lines.get(key)
            return lines is not None and norm in lines

    def remember(self, key: object, text: str) -> None:
        if self.size == 0:
            return
        with self._lock:
            lines = self._lines.get(key)
            if lines is None:
                lines = self._lines[key] = deque(maxlen=self.size)
                if len(self._lines) > self.max_keys:
                    self._lines.popitem(last=False)
            else:
                self._lines.move_to_end(key)
            lines.append(normalise_line(text))

    def recent(self, key: object) -> list[str]:
        """The remembered (normalised) lines for ``key``, oldest first."""
        with self._lock:
            return list(self._lines.get(key, ()))


@dataclass(frozen=True)
class SlotRules:
    """Which free-text slots a line may contain, per archetype, state and intent (from the line book)."""

    slots: tuple[str, ...]
    archetype: Mapping[str, frozenset[str]]
    state: Mapping[str, frozenset[str]]
    intent: Mapping[str, frozenset[str]]

    def allowed(self, archetype: str, state: str, intent: str) -> frozenset[str]:
        return (self.archetype.get(archetype, frozenset()) | self.state.get(state, frozenset())
                | self.intent.get(intent, frozenset()))


def read_constraints(model_dir: str | Path | None = None, book_path: str | Path | None = None
                     ) -> tuple[list[str], SlotRules]:
    """(banned words, slot rules) for a model: ``model_dir/constraints.json`` if present, else the
    line book's (default: the shipped one).

    ``constraints.json``: ``{"banned_words": [...], "slots": [...], "slot_rules": {"archetype":
    {name: [slots]}, "state": {...}, "intent": {...}}}``. The line book is read for these two
    fields only (its YAML, without expanding templates), which keeps model loading fast; the
    book itself is validated when a model is trained from it.
    """
    if model_dir is not None and (Path(model_dir) / "constraints.json").is_file():
        path = Path(model_dir) / "constraints.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            rules = data["slot_rules"]
            return list(data["banned_words"]), SlotRules(
                tuple(data["slots"]),
                *({k: frozenset(v) for k, v in rules[kind].items()} for kind in ("archetype", "state", "intent")))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a constraints file ({exc})") from exc
    import yaml

    from runtime.linebook import DEFAULT_PATH

    root = Path(book_path) if book_path is not None else DEFAULT_PATH
    files = sorted(p for p in root.iterdir() if p.suffix in (".yaml", ".yml")) if root.is_dir() else [root]
    banned: list[str] = []
    slots: list[str] = []
    rules: dict[str, dict[str, frozenset[str]]] = {"archetypes": {}, "states": {}, "intents": {}}
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for file in files:
        try:
            doc = yaml.load(file.read_text(encoding="utf-8"), Loader=loader) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"{file}: cannot read the line book ({exc})") from exc
        for word in doc.get("banned_words") or ():
            if str(word).strip().lower() not in banned:
                banned.append(str(word).strip().lower())
        slots += [str(s) for s in doc.get("slots") or () if str(s) not in slots]
        for section, table in rules.items():
            for name, spec in (doc.get(section) or {}).items():
                table[str(name)] = frozenset((spec or {}).get("slots") or ()) if isinstance(spec, dict) else frozenset()
    return banned, SlotRules(tuple(slots), rules["archetypes"], rules["states"], rules["intents"])


def usable(text: str) -> str | None:
    """None if ``text`` is a usable line, else why not (``empty``, ``no_words``)."""
    if not text.strip():
        return "empty"
    if not re.search(r"[A-Za-z]{2,}", text):
        return "no_words"
    return None


def check_sampling(temperature: float, top_k: int, top_p: float, max_tokens: int,
                   min_tokens: int = 0) -> None:
    """Raise ValueError naming the first out-of-range sampling parameter."""
    if not isinstance(temperature, (int, float)) or not np.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if not isinstance(top_k, (int, np.integer)) or isinstance(top_k, bool) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 = no limit), got {top_k!r}")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if not isinstance(max_tokens, (int, np.integer)) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
    if not isinstance(min_tokens, (int, np.integer)) or not 0 <= min_tokens <= max_tokens:
        raise ValueError(f"min_tokens must be an int in [0, max_tokens={max_tokens}], got {min_tokens!r}")


def stop_index(text: str, stops: Sequence[str]) -> int:
    """Index of the first stop string in ``text``, or -1."""
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else -1


__all__ = ["BannedWordMask", "RepeatMemory", "SlotRules", "WordState", "check_sampling",
           "fill_slots", "normalise_line", "read_constraints", "stop_index", "unfilled_slots", "usable"]
