"""Templates: ``{slot}``, ``[group]`` and ``(a|b|)`` markup parsed into parts, the fragments they
come from, and compose patterns.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from runtime.factory.linebook.types import _NAME_RE, _SLOT_RE, LintProblem, _Where

# A parsed template is a tuple of parts: str (literal), ("slot", name), ("ref", group),
# ("alt", (template, template, ...)).
_Part = Any
_Template = tuple


@dataclass(frozen=True)
class _Source:
    template: _Template
    where: _Where
    slots: frozenset[str]
    refs: frozenset[str]
    # a writer's marks (docs/linebook.md, "Where a fragment fits"): intents and states the
    # fragment is never drawn with, the only intents / states it is drawn with (empty: any),
    # and the only part of a line it may be ("start", "end"; None: anywhere)
    never: frozenset[str] = frozenset()
    only_intents: frozenset[str] = frozenset()
    only_states: frozenset[str] = frozenset()
    at: str | None = None

    def fits(self, state: str, intent: str, position: str | None) -> bool:
        """Whether the fragment may be drawn in a line for ``state`` and ``intent`` as a part at
        ``position`` (``"start"``, ``"end"``, ``"both"`` for a line's only part, None inside
        another part or between two)."""
        if state in self.never or intent in self.never:
            return False
        if self.only_intents and intent not in self.only_intents:
            return False
        if self.only_states and state not in self.only_states:
            return False
        return self.at is None or position in (self.at, "both")


def _parse_template(text: str, where: _Where) -> _Template:
    pos = 0

    def parse_seq(depth: int) -> tuple[list[_Template], str]:
        nonlocal pos
        alts: list[_Template] = []
        parts: list[_Part] = []
        buf: list[str] = []

        def flush() -> None:
            if buf:
                parts.append("".join(buf))
                buf.clear()

        while pos < len(text):
            ch = text[pos]
            if ch == "(":
                flush()
                pos += 1
                inner, end = parse_seq(depth + 1)
                if end != ")":
                    raise where.error(f"unclosed '(' in template {text!r}")
                parts.append(("alt", tuple(inner)))
            elif ch == ")":
                if depth == 0:
                    raise where.error(f"unmatched ')' in template {text!r}")
                flush()
                alts.append(tuple(parts))
                pos += 1
                return alts, ")"
            elif ch == "|":
                if depth == 0:
                    raise where.error(f"'|' outside parentheses in template {text!r}")
                flush()
                alts.append(tuple(parts))
                parts = []
                pos += 1
            elif ch == "[":
                end = text.find("]", pos)
                name = text[pos + 1 : end] if end > 0 else ""
                if end < 0 or not _NAME_RE.match(name):
                    raise where.error(f"bad group reference at column {pos + 1} in {text!r}")
                flush()
                parts.append(("ref", name))
                pos = end + 1
            elif ch == "]":
                raise where.error(f"unmatched ']' in template {text!r}")
            elif ch == "{":
                m = _SLOT_RE.match(text, pos)
                if not m:
                    raise where.error(f"bad slot marker at column {pos + 1} in {text!r}")
                flush()
                parts.append(("slot", m.group(1)))
                pos = m.end()
            elif ch == "}":
                raise where.error(f"unmatched '}}' in template {text!r}")
            else:
                buf.append(ch)
                pos += 1
        flush()
        alts.append(tuple(parts))
        return alts, ""

    seqs, _ = parse_seq(0)
    return seqs[0]


def _collect(template: _Template, slots: set[str], refs: set[str]) -> None:
    for part in template:
        if isinstance(part, str):
            continue
        kind, value = part
        if kind == "slot":
            slots.add(value)
        elif kind == "ref":
            refs.add(value)
        else:
            for alt in value:
                _collect(alt, slots, refs)


def _literal_text(text: str) -> str:
    """The authored words of a template, markup replaced by spaces (for the banned-word check)."""
    text = _SLOT_RE.sub(" ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    return re.sub(r"[()|]", " ", text)
# ---------------------------------------------------------------- the book


@dataclass
class _Pattern:
    template: _Template
    weight: int
    tones: tuple[str, ...]
    where: _Where
    refs: frozenset[str] = frozenset()
    positions: tuple[str | None, ...] = ()  # per template part: see _part_positions
    fit: _Source | None = None  # the pattern's not_with / only_with marks (fit.fits(state, intent, None))
    max_sentences: int | None = None  # a line of more sentences is drawn again (None: any)


class _Drawn(NamedTuple):
    """A line the composition drew (:meth:`LineBook._compose`)."""

    text: str
    problem: LintProblem | None  # a template artifact it shows (lint_line, the player named twice, a repeat)
    fits: bool  # within the book's word limits and the pattern's sentence count
    pattern: _Pattern


_NO_SOURCES: list[_Source] = []  # one empty list: :meth:`LineBook._fitting` caches lists by id


def _part_positions(template: _Template) -> tuple[str | None, ...]:
    """Where each top-level group of a compose pattern sits in the line: ``"start"`` for the
    first group when nothing but spaces and marks precede it, ``"end"`` for the last when
    nothing but spaces and marks follow, ``"both"`` for a group that is both, None otherwise
    (a group between two, literals, slots, alternatives)."""
    refs = [i for i, p in enumerate(template) if not isinstance(p, str) and p[0] == "ref"]
    out: list[str | None] = [None] * len(template)
    if not refs:
        return tuple(out)

    def blank(parts: Sequence[_Part]) -> bool:
        return all(isinstance(p, str) and not re.search(r"[A-Za-z0-9]", p) for p in parts)

    first, last = refs[0], refs[-1]
    starts, ends = blank(template[:first]), blank(template[last + 1:])
    for i in refs:
        at_start, at_end = i == first and starts, i == last and ends
        out[i] = "both" if at_start and at_end else "start" if at_start else "end" if at_end else None
    return tuple(out)
