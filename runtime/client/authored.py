"""A studio's authored lines, played back where the writers covered a request.

A fine-tune ships the studio's own lines beside the model as ``authored.json``. The engine
serves one of them, not a generated line, when the writers wrote lines for the request's *cell*
(archetype, state, intent) that the request satisfies; the model writes only for the cells they
did not cover. A whole authored line is what a writer would ship; a generated line for a covered
cell can only tie it. (Measured: ``flashnpc eval studio``, docs/finetune.md.)

**Which lines a request may get** (:meth:`AuthoredBook.playable`), as Valve's response rules
match criteria: a line's tags are its criteria, and every one must hold.

* archetype, state and intent equal the request's;
* every persona trait of the line is in the request's persona;
* every ``slot=value`` of the line's context is in the request's context;
* every ``{slot}`` the line uses has a value (the request's, or the model's slot default).

The most specific lines come first (most persona and context criteria met: a line written for
``alarm=red`` beats an untagged one when the alarm is red); among equally specific lines the
caller picks one it has not said recently.

**The rule pick** (:meth:`AuthoredBook.rule_pick`) is the reference FlashNPC is measured
against: the same archetype's line whose tags match the request best (one point for each of
state, intent, persona trait and context pair the line shares with the request; a line whose
persona or context contradicts the request is out), ties drawn with the caller's generator. It
is what a game without a model would play back.

**File format** (``authored.json``), version 1::

    {"version": 1,
     "lines": [{"archetype": "dockmaster", "state": "working", "intent": "greet",
                "persona": ["weary"], "context": {"alarm": "red"}, "text": "Bay four. Make it quick."},
               ...]}

``persona`` and ``context`` may be left out (none). A malformed file raises ValueError naming the
file and the line's index.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.client.fallback import NEAR_STATES

FORMAT_VERSION = 1

FIT_MARGIN = 0.15
"""Near-state lines whose state fit is within this many nats (mean log-probability per token) of
the best one's are equally good choices: one of them is drawn, for variety."""

_SLOT = re.compile(r"\{([a-z_]+)\}")
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")
_SENTENCE_END = re.compile(r"[.!?;:]+")

MARK_LINES = 3
"""A word or word pair *marks* a state when at least this many of the studio's lines say it, all
written for that state ("on break" for rest, "rounds" for patrol, "take cover" for combat)."""


@dataclass(frozen=True)
class AuthoredLine:
    """One line a writer wrote, with the tags it was written for."""

    archetype: str
    state: str
    intent: str
    text: str
    persona: tuple[str, ...] = ()
    context: tuple[tuple[str, str], ...] = ()

    @property
    def slots(self) -> frozenset[str]:
        return frozenset(_SLOT.findall(self.text))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"archetype": self.archetype, "state": self.state, "intent": self.intent}
        if self.persona:
            out["persona"] = list(self.persona)
        if self.context:
            out["context"] = dict(self.context)
        out["text"] = self.text
        return out


Cell = tuple[str, str, str]


class AuthoredBook:
    """A studio's authored lines, indexed by (archetype, state, intent) cell."""

    def __init__(self, lines: Iterable[AuthoredLine]) -> None:
        self.lines: tuple[AuthoredLine, ...] = tuple(dict.fromkeys(lines))
        self._cells: dict[Cell, list[AuthoredLine]] = {}
        self._by_archetype: dict[str, list[AuthoredLine]] = {}
        for line in self.lines:
            self._cells.setdefault((line.archetype, line.state, line.intent), []).append(line)
            self._by_archetype.setdefault(line.archetype, []).append(line)
        self.state_marks = _state_marks(self.lines)
        self._marked = {line: {s for s, marks in self.state_marks.items() if _grams(line.text) & marks}
                        for line in self.lines}

    def __len__(self) -> int:
        return len(self.lines)

    @property
    def cells(self) -> frozenset[Cell]:
        """Every (archetype, state, intent) the writers wrote a line for."""
        return frozenset(self._cells)

    # ------------------------------------------------------------------ reading and writing

    @classmethod
    def from_json(cls, path: str | Path) -> AuthoredBook:
        path = Path(path)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: cannot read authored lines ({exc})") from exc
        return cls.from_doc(doc, source=str(path))

    @classmethod
    def from_doc(cls, doc: Any, *, source: str = "authored.json") -> AuthoredBook:
        if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION:
            raise ValueError(f"{source}: expected {{\"version\": {FORMAT_VERSION}, \"lines\": [...]}}")
        extra = sorted(set(doc) - {"version", "lines"})
        if extra:
            raise ValueError(f"{source}: {extra[0]}: unknown key; known: lines, version")
        raw = doc.get("lines")
        if not isinstance(raw, list):
            raise ValueError(f"{source}: lines: expected a list of line objects")
        return cls(_line(item, f"{source}: lines[{i}]") for i, item in enumerate(raw))

    def to_doc(self) -> dict[str, Any]:
        return {"version": FORMAT_VERSION, "lines": [line.to_json() for line in self.lines]}

    # ------------------------------------------------------------------ matching

    def playable(self, archetype: str, state: str, intent: str, persona: Sequence[str] = (),
                 context: Mapping[str, str] | None = None, slots: Iterable[str] = ()
                 ) -> list[list[AuthoredLine]]:
        """The cell's lines whose criteria the request meets (module docstring), grouped by
        specificity, most specific group first; empty when the writers did not cover the request."""
        asked_persona = set(persona)
        asked = dict(context or {})
        filled = set(slots)
        groups: dict[int, list[AuthoredLine]] = {}
        for line in self._cells.get((archetype, state, intent), ()):
            if not set(line.persona) <= asked_persona or not line.slots <= filled:
                continue
            if any(asked.get(k) != v for k, v in line.context):
                continue
            groups.setdefault(len(line.persona) + len(line.context), []).append(line)
        return [groups[k] for k in sorted(groups, reverse=True)]

    def covers(self, archetype: str, state: str, intent: str, persona: Sequence[str] = (),
               context: Mapping[str, str] | None = None, slots: Iterable[str] = ()) -> bool:
        return bool(self.playable(archetype, state, intent, persona, context, slots))

    def choose(self, archetype: str, state: str, intent: str, persona: Sequence[str] = (),
               context: Mapping[str, str] | None = None, *, slots: Iterable[str] = (),
               rng: np.random.Generator, usable: Callable[[AuthoredLine], bool] = lambda _ln: True,
               ) -> AuthoredLine | None:
        """The cell's line to play back: from the most specific group of :meth:`playable` that
        holds a ``usable`` line (the caller's checks: not said recently, no banned phrase), one
        drawn with ``rng``; None when the cell is not covered or nothing in it is usable."""
        for group in self.playable(archetype, state, intent, persona, context, slots):
            fresh = [ln for ln in group if usable(ln)]
            if fresh:
                return fresh[int(rng.integers(len(fresh)))]
        return None

    def near(self, archetype: str, state: str, intent: str, persona: Sequence[str] = (),
             context: Mapping[str, str] | None = None, *, slots: Iterable[str] = (),
             usable: Callable[[AuthoredLine], bool] = lambda _ln: True) -> list[AuthoredLine]:
        """For a cell the writers left empty: the archetype's usable lines for the same move in
        the :data:`runtime.client.fallback.NEAR_STATES` of ``state`` whose criteria the request
        meets, nearest state first, less those that say a word marking another state
        (:data:`MARK_LINES`: "I'm on break" is a rest line, never an idle one); of these only
        the most specific (a line voicing the request's persona trait or context value over an
        untagged one)."""
        slots = tuple(slots)
        found = [ln for near in NEAR_STATES.get(state, ())
                 for group in self.playable(archetype, near, intent, persona, context, slots)
                 for ln in group if not self._marked[ln] - {state} and usable(ln)]
        top = max((len(ln.persona) + len(ln.context) for ln in found), default=0)
        return [ln for ln in found if len(ln.persona) + len(ln.context) == top]

    @staticmethod
    def choose_fitting(lines: Sequence[AuthoredLine], fit: np.ndarray, rng: np.random.Generator,
                       margin: float = FIT_MARGIN) -> AuthoredLine:
        """One of the lines whose ``fit`` (:func:`runtime.client.line_fit.state_fit`) is within
        ``margin`` nats of the best, drawn with ``rng``."""
        fit = np.asarray(fit)
        close = np.flatnonzero(fit >= fit.max() - margin)
        return lines[int(close[int(rng.integers(len(close)))])]

    def rule_pick(self, archetype: str, state: str, intent: str, persona: Sequence[str] = (),
                  context: Mapping[str, str] | None = None, *, rng: np.random.Generator,
                  slots: Iterable[str] = ()) -> AuthoredLine | None:
        """The reference line (module docstring): the archetype's best tag match, or None when
        the archetype has no line the request's persona, context and slots allow."""
        asked_persona = set(persona)
        asked = dict(context or {})
        filled = set(slots)
        best: list[AuthoredLine] = []
        top = -1
        for line in self._by_archetype.get(archetype, ()):
            if not set(line.persona) <= asked_persona or not line.slots <= filled:
                continue
            if any(asked.get(k) != v for k, v in line.context):
                continue
            score = ((line.state == state) + (line.intent == intent) + len(line.persona)
                     + len(line.context))
            if score > top:
                best, top = [line], score
            elif score == top:
                best.append(line)
        return best[int(rng.integers(len(best)))] if best else None


def _grams(text: str) -> set[tuple[str, ...]]:
    """The words and word pairs of ``text``, within its sentences, lower case, slots left out."""
    out: set[tuple[str, ...]] = set()
    for sentence in _SENTENCE_END.split(_SLOT.sub(" ", text.lower())):
        words = _WORD.findall(sentence)
        out.update((w,) for w in words)
        out.update(itertools.pairwise(words))
    return out


def _state_marks(lines: Sequence[AuthoredLine]) -> dict[str, set[tuple[str, ...]]]:
    """Per state, the words and word pairs that mark it (:data:`MARK_LINES`)."""
    seen: dict[tuple[str, ...], dict[str, int]] = {}
    for line in lines:
        for g in _grams(line.text):
            states = seen.setdefault(g, {})
            states[line.state] = states.get(line.state, 0) + 1
    marks: dict[str, set[tuple[str, ...]]] = {}
    for g, states in seen.items():
        if len(states) == 1:
            (state, n), = states.items()
            if n >= MARK_LINES:
                marks.setdefault(state, set()).add(g)
    return marks


def _line(item: Any, where: str) -> AuthoredLine:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected an object")
    extra = sorted(set(item) - {"archetype", "state", "intent", "persona", "context", "text"})
    if extra:
        raise ValueError(f"{where}: {extra[0]}: unknown key")
    fields = {}
    for key in ("archetype", "state", "intent", "text"):
        value = item.get(key)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{where}: {key}: expected a non-empty string")
        fields[key] = value
    persona = item.get("persona", [])
    if not isinstance(persona, list) or not all(isinstance(t, str) for t in persona):
        raise ValueError(f"{where}: persona: expected a list of trait names")
    context = item.get("context", {})
    if not isinstance(context, dict) or not all(isinstance(v, str) for v in context.values()):
        raise ValueError(f"{where}: context: expected an object of slot: value strings")
    return AuthoredLine(fields["archetype"], fields["state"], fields["intent"], fields["text"],
                        tuple(sorted(set(persona))), tuple(sorted(context.items())))


__all__ = ["FORMAT_VERSION", "AuthoredBook", "AuthoredLine"]
