"""Authored fallback lines: what an NPC says when the model cannot answer in time or at all.

The lines come from the line book (``fallbacks:`` section, expanded per archetype by
:meth:`runtime.factory.linebook.LineBook.fallback_lines`), shipped beside a model as
``fallbacks.json`` (``{archetype: {state: [lines]}}``). :meth:`FallbackBook.pick` returns a
line that fits the archetype and state and is never the same line twice in a row for one NPC.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from runtime.paths import DEFAULT_MODEL_DIR

GENERIC = ("...", "Hm.", "Not now.")


class FallbackBook:
    """Fallback lines per (archetype, state). Thread-safe."""

    def __init__(self, lines: Mapping[tuple[str, str], Sequence[str]], *, max_npcs: int = 10_000) -> None:
        self.lines: dict[tuple[str, str], tuple[str, ...]] = {
            k: tuple(v) for k, v in lines.items() if len(v) > 0
        }
        self._by_arch: dict[str, list[str]] = {}
        for (arch, _state), texts in self.lines.items():
            bucket = self._by_arch.setdefault(arch, [])
            bucket.extend(t for t in texts if t not in bucket)
        self._last: OrderedDict[object, str] = OrderedDict()
        self._max_npcs = max_npcs
        self._lock = threading.Lock()

    @classmethod
    def from_json(cls, path: str | Path) -> FallbackBook:
        """Read ``fallbacks.json`` ({archetype: {state: [lines]}}); errors name the file."""
        path = Path(path)
        try:
            table = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: cannot read fallback lines ({exc})") from exc
        if not isinstance(table, dict):
            raise ValueError(f"{path}: expected an object {{archetype: {{state: [lines]}}}}")
        lines: dict[tuple[str, str], list[str]] = {}
        for arch, states in table.items():
            if not isinstance(states, dict):
                raise ValueError(f"{path}: {arch!r} must map states to lists of lines")
            for state, texts in states.items():
                if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                    raise ValueError(f"{path}: {arch}.{state} must be a list of strings")
                lines[(arch, state)] = texts
        return cls(lines)

    @classmethod
    def shipped(cls) -> FallbackBook:
        """The shipped model's ``fallbacks.json`` (the default line book's fallbacks, expanded at
        export): for a model directory that holds none. The line book itself is the model
        factory's (``FallbackBook(load_line_book(path).fallback_lines())``)."""
        return cls.from_json(DEFAULT_MODEL_DIR / "fallbacks.json")

    def candidates(self, archetype: str, state: str) -> tuple[str, ...]:
        """Lines for (archetype, state); else any line of the archetype; else generic ones."""
        return self.lines.get((archetype, state)) or tuple(self._by_arch.get(archetype, ())) or GENERIC

    def pick(self, archetype: str, state: str, npc_key: object, rng: np.random.Generator) -> str:
        """A fitting line, different from the last fallback this NPC (``npc_key``) said if possible."""
        options = self.candidates(archetype, state)
        with self._lock:
            last = self._last.get(npc_key)
            pool = [t for t in options if t != last] or list(options)
            text = pool[int(rng.integers(len(pool)))]
            self._last[npc_key] = text
            self._last.move_to_end(npc_key)
            if len(self._last) > self._max_npcs:
                self._last.popitem(last=False)
        return text


__all__ = ["FallbackBook"]
