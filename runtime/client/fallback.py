"""Authored fallback lines: what an NPC says when the model cannot answer in time or at all.

The lines come from the line book (``fallbacks:`` section, expanded per archetype by
:meth:`runtime.factory.linebook.LineBook.fallback_cells`) and ship beside a model as
``fallbacks.json``. Each *cell* is keyed by (archetype, state, intent), where the intent is one
of the catalog's intents (the player's move) or :data:`ANY_INTENT` for lines that answer any
move.

**Which cell answers** (:meth:`FallbackBook.candidates`), first non-empty of, in order of
specificity as Valve's response rules pick:

1. (archetype, state, intent): lines written for that move, so a farewell gets a farewell and a
   rumour question a "no news" answer;
2. (archetype, near state, intent) for each of :data:`NEAR_STATES` ``[state]`` in order: the
   archetype's lines for the same move in a state of the same temper (an alert guard greeted
   answers as a patrolling one would, never as a resting one), for a studio that did not write
   the cell (a fine-tune writes only the cells its writers covered);
3. (archetype, state, ``any``): the state's intent-neutral lines (also what an old-format file
   holds, and what a caller that does not say the intent gets);
4. :data:`GENERIC` ("...", "Hm."), which fit any archetype, state, move and context.

A line written for another move is never served while one for the move exists within the
state's temper; there is no step to another archetype's lines, nor to a state of the other
temper (a fighting NPC does not answer with its friendly lines). The line book resolves its own layers into these cells
before export (an archetype's own lines for the move, then the state's lines for the move in the
archetype's voice, then the archetype's own intent-neutral lines, then the state's;
docs/linebook.md, "fallbacks"), so a shipped file has a cell for every (archetype, state,
intent) the book writes. Fallback lines are served as written: no slots, and nothing that
asserts a context value (time of day, weather, ...), since a fallback may be served under any.

**File format** (``fallbacks.json``), version 3: every distinct line once, in ``strings``, and
the cells as indexes into it (a state's lines recur in every archetype's cells, so this is half
the bytes of version 2, which the mobile bundle's 8 MB budget needs)::

    {"version": 3,
     "strings": ["Keep your distance, citizen!", "Go, then, and stay gone.", ...],
     "lines": {"guard": {"alert": {"any": [0, ...], "farewell": [1, ...], ...}, ...}, ...}}

Version 2 is the same with the lines written out in the cells (``"any": ["Keep your distance,
citizen!", ...]``); version 1, the format before intents, is ``{archetype: {state: [lines]}}``
(its lines become the ``any`` cells). Both still read: fine-tunes and bundles in the field carry
them. A malformed file raises ValueError naming the file and the key.

:meth:`FallbackBook.pick` draws a line of the answering cell with the caller's seeded
generator, never the same line twice in a row for one NPC when the cell has another.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from runtime.paths import DEFAULT_MODEL_DIR

GENERIC = ("...", "Hm.")
"""The last resort: lines that fit every archetype, state, intent and context."""

ANY_INTENT = "any"
"""The intent key of a cell whose lines answer any move (no catalog intent may be called this)."""

FORMAT_VERSION = 3
"""The ``fallbacks.json`` version :meth:`FallbackBook.to_doc` writes; 1 (no ``version`` key:
``{archetype: {state: [lines]}}``), 2 and 3 read."""

_READS = (2, 3)

NEAR_STATES: dict[str, tuple[str, ...]] = {
    "alert": ("combat",),
    "combat": ("flee",),
    "flee": ("combat",),
    "friendly": ("idle",),
    "idle": ("friendly", "working", "rest", "patrol"),
    "patrol": ("idle", "working", "alert"),
    "rest": ("idle", "friendly"),
    "working": ("idle", "patrol", "friendly"),
}
"""For each behaviour state, the states whose lines for a move may answer it when the state's
own cell for the move is empty, nearest first. Chosen by blind reading (docs/finetune.md, "Which
near states"): a studio line for the same move written for one of these states was shipped as
is for the asked state in 43-100% of readings; an alert NPC answering with a patrol line, a
friendly one with a rest or working line, a fighting one with an alert line were shipped in
0-25% and are not listed. A state not listed (a game's own) has no near states."""

Cell = tuple[str, str, str]


class FallbackBook:
    """Fallback lines per (archetype, state, intent) cell, picked in the order the module
    describes. Thread-safe.

    ``lines`` maps cells to lines; a key of two parts, (archetype, state), is the
    (archetype, state, :data:`ANY_INTENT`) cell (what a version-1 table gives). Empty cells are
    dropped. ``max_npcs``: how many NPCs' last fallback are remembered (oldest forgotten first).
    """

    def __init__(self, lines: Mapping[tuple[str, str] | tuple[str, str, str], Sequence[str]], *,
                 max_npcs: int = 10_000) -> None:
        self.lines: dict[Cell, tuple[str, ...]] = {}
        for key, texts in lines.items():
            cell: Cell = (key[0], key[1], key[2] if len(key) == 3 else ANY_INTENT)  # type: ignore[misc]
            if len(texts) > 0:
                self.lines[cell] = tuple(texts)
        self._last: OrderedDict[object, str] = OrderedDict()
        self._max_npcs = max_npcs
        self._lock = threading.Lock()

    @classmethod
    def from_json(cls, path: str | Path) -> FallbackBook:
        """Read a ``fallbacks.json`` (version 1 or 2); errors name the file and the key."""
        path = Path(path)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: cannot read fallback lines ({exc})") from exc
        return cls.from_doc(doc, source=str(path))

    @classmethod
    def from_doc(cls, doc: Any, *, source: str = "fallbacks.json") -> FallbackBook:
        """The book a parsed ``fallbacks.json`` document describes (version 1, 2 or 3).
        ValueError, starting with ``source`` and naming the key, for anything else."""
        if not isinstance(doc, dict):
            raise ValueError(f"{source}: expected an object ({{\"version\": 3, \"strings\": ..., "
                             f"\"lines\": ...}} or {{archetype: {{state: [lines]}}}})")
        version = doc.get("version")
        if isinstance(version, bool) or not isinstance(version, int):
            return cls(_read_v1(doc, source))
        if version not in _READS:
            raise ValueError(f"{source}: version: {version} is not a fallbacks.json version this engine "
                             f"reads (1, {', '.join(map(str, _READS))})")
        known = {"version", "lines"} | ({"strings"} if version == 3 else set())
        extra = sorted(set(doc) - known)
        if extra:
            raise ValueError(f"{source}: {extra[0]}: unknown key; known: {', '.join(sorted(known))}")
        strings = _strings(doc.get("strings"), source, "strings") if version == 3 else None
        table = doc.get("lines")
        if not isinstance(table, dict):
            raise ValueError(f"{source}: lines: expected an object {{archetype: {{state: {{intent: [lines]}}}}}}")
        lines: dict[Cell, list[str]] = {}
        for arch, states in table.items():
            if not isinstance(states, dict):
                raise ValueError(f"{source}: lines.{arch} must map states to intents")
            for state, intents in states.items():
                if not isinstance(intents, dict):
                    raise ValueError(f"{source}: lines.{arch}.{state} must map intents "
                                     f"(or {ANY_INTENT!r}) to lists of lines")
                for intent, texts in intents.items():
                    key = f"lines.{arch}.{state}.{intent}"
                    lines[(arch, state, intent)] = (_strings(texts, source, key) if strings is None
                                                    else _indexed(texts, strings, source, key))
        return cls(lines)

    @classmethod
    def shipped(cls) -> FallbackBook:
        """The shipped model's ``fallbacks.json`` (the default line book's fallbacks, expanded at
        export): for a model directory that holds none. The line book itself is the model
        factory's (``FallbackBook(load_line_book(path).fallback_cells())``)."""
        return cls.from_json(DEFAULT_MODEL_DIR / "fallbacks.json")

    def to_doc(self) -> dict[str, Any]:
        """The version-3 ``fallbacks.json`` document of these cells (archetypes, states and intents
        in the order first seen, ``any`` first within a state; ``strings`` in the order first
        used)."""
        strings: dict[str, int] = {}
        table: dict[str, dict[str, dict[str, list[int]]]] = {}
        for (arch, state, intent), texts in sorted(self.lines.items(), key=lambda kv: kv[0][2] != ANY_INTENT):
            table.setdefault(arch, {}).setdefault(state, {})[intent] = [
                strings.setdefault(t, len(strings)) for t in texts]
        return {"version": FORMAT_VERSION, "strings": list(strings), "lines": table}

    def replaced(self, lines: Mapping[tuple[str, str] | tuple[str, str, str], Sequence[str]]) -> FallbackBook:
        """A new book with ``lines``'s cells written over these; a two-part key (archetype, state)
        replaces the whole (archetype, state): its ``any`` cell and every intent cell."""
        out = dict(self.lines)
        for key in lines:
            if len(key) == 2:
                out = {c: t for c, t in out.items() if c[:2] != key}
        out.update({(k[0], k[1], k[2] if len(k) == 3 else ANY_INTENT): tuple(v)  # type: ignore[misc]
                    for k, v in lines.items()})
        return FallbackBook(out, max_npcs=self._max_npcs)

    def candidates(self, archetype: str, state: str, intent: str | None = None) -> tuple[str, ...]:
        """The lines that answer ``intent`` (None: unknown) from ``archetype`` in ``state``: the
        first non-empty of the (archetype, state, intent) cell, the (archetype, near state,
        intent) cells (:data:`NEAR_STATES`), the (archetype, state, any) cell and
        :data:`GENERIC`."""
        if intent is not None:
            for near in (state, *NEAR_STATES.get(state, ())):
                own = self.lines.get((archetype, near, intent))
                if own:
                    return own
        return self.lines.get((archetype, state, ANY_INTENT)) or GENERIC

    def pick(self, archetype: str, state: str, npc_key: object, rng: np.random.Generator,
             intent: str | None = None) -> str:
        """A line of :meth:`candidates` drawn with ``rng``, different from the last fallback this
        NPC (``npc_key``) said when the cell holds another."""
        options = self.candidates(archetype, state, intent)
        with self._lock:
            last = self._last.get(npc_key)
            pool = [t for t in options if t != last] or list(options)
            text = pool[int(rng.integers(len(pool)))]
            self._last[npc_key] = text
            self._last.move_to_end(npc_key)
            if len(self._last) > self._max_npcs:
                self._last.popitem(last=False)
        return text


def _strings(texts: Any, source: str, key: str) -> list[str]:
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"{source}: {key} must be a list of strings")
    return texts


def _indexed(refs: Any, strings: list[str], source: str, key: str) -> list[str]:
    if not isinstance(refs, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in refs):
        raise ValueError(f"{source}: {key} must be a list of indexes into strings")
    bad = [i for i in refs if not 0 <= i < len(strings)]
    if bad:
        raise ValueError(f"{source}: {key}: index {bad[0]} is outside strings (0..{len(strings) - 1})")
    return [strings[i] for i in refs]


def _read_v1(doc: dict[str, Any], source: str) -> dict[Cell, list[str]]:
    """A version-1 table, ``{archetype: {state: [lines]}}``: its lines are the ``any`` cells."""
    lines: dict[Cell, list[str]] = {}
    for arch, states in doc.items():
        if not isinstance(states, dict):
            raise ValueError(f"{source}: {arch!r} must map states to lists of lines")
        for state, texts in states.items():
            lines[(arch, state, ANY_INTENT)] = _strings(texts, source, f"{arch}.{state}")
    return lines


__all__ = ["ANY_INTENT", "FORMAT_VERSION", "GENERIC", "NEAR_STATES", "FallbackBook"]
