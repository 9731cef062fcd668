"""The line book: the YAML training data game writers author, its validator and its expansion.

A line book is one YAML file or a directory of ``*.yaml`` files (read in name order and
merged section by section). It declares the closed vocabulary a prompt is made of
(archetypes, persona traits, behavior states, player intents, context slots and values),
the free-text slots filled after generation (``{player}``, ``{location}``, ``{item}``),
banned out-of-setting words, and the authored fragments that expand into training lines.
The format is documented in ``docs/linebook.md``.

Templates use three kinds of markup:

* ``{player}``: a free-text slot, kept in the generated line and filled by the game;
* ``[group]``: a fragment drawn from a group (archetype voice, the state's leads, the
  reply for the state and intent, the persona's mood, a context fragment, ...);
* ``(a|b|)``: inline alternatives, one chosen per line; an empty alternative is allowed.

Every error found while loading raises :class:`LineBookError` naming file, line and field.
Expansion is deterministic (seeded from the book's ``expansion.seed`` and the condition
names), needs no disk cache and takes a few seconds for the default book.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from runtime.factory.linebook.book import LineBook
from runtime.factory.linebook.lint import (
    _normalize,
    closest_first,
    lint_line,
    repeated_word,
    sentences,
)
from runtime.factory.linebook.reader import _Raw, _read_file
from runtime.factory.linebook.types import (
    _COMMON,
    BUILTIN_GROUPS,
    DEFAULT_PATH,
    FALLBACK_MAX_WORDS,
    TONES,
    VOICE_MARKER_MIN_TEMPLATES,
    Example,
    LineBookError,
    LintProblem,
    Split,
)

if TYPE_CHECKING:
    from runtime.client.constraints import Constraints

__all__ = [
    "BUILTIN_GROUPS",
    "DEFAULT_PATH",
    "FALLBACK_MAX_WORDS",
    "TONES",
    "V4_COMPOSE",
    "VOICE_MARKER_MIN_TEMPLATES",
    "_COMMON",
    "Example",
    "LineBook",
    "LineBookError",
    "LintProblem",
    "Split",
    "_normalize",
    "book_constraints",
    "book_with_compose",
    "closest_first",
    "lint_line",
    "load_line_book",
    "repeated_word",
    "sentences",
]

V4_COMPOSE = DEFAULT_PATH.parent / "compose_v4.yaml"
"""Book v4's measured compose patterns (docs/linebook.md, "Book v4"): the default book draws the
v3.1 patterns (``05_compose.yaml``) the shipped model was trained on until a model is trained on v4."""


def book_with_compose(out_dir: str | Path, compose: str | Path = V4_COMPOSE, path: str | Path | None = None) -> Path:
    """A copy of a book directory (default: the shipped one) in ``out_dir`` with ``compose`` (a
    YAML file holding a ``compose`` section) in place of its ``05_compose.yaml``; returns
    ``out_dir``. ``BOOK=v4 bash bench/gpu_train.sh`` trains on such a copy."""
    src, out = Path(path) if path is not None else DEFAULT_PATH, Path(out_dir)
    if not (src / "05_compose.yaml").is_file():
        raise LineBookError(str(src), 0, "compose", "no 05_compose.yaml to replace")
    shutil.copytree(src, out, dirs_exist_ok=True)
    shutil.copyfile(compose, out / "05_compose.yaml")
    return out


def load_line_book(path: str | Path | None = None) -> LineBook:
    """Load and validate a line book: a YAML file, a directory of them, or None for the default."""
    root = Path(path) if path is not None else DEFAULT_PATH
    if root.is_dir():
        files = sorted(p for p in root.iterdir() if p.suffix in (".yaml", ".yml"))
        if not files:
            raise LineBookError(str(root), 0, "<directory>", "no .yaml files")
    elif root.is_file():
        files = [root]
    else:
        raise LineBookError(str(root), 0, "<path>", "no such file or directory")
    raw = _Raw()
    for file in files:
        _read_file(file, raw)
    return LineBook(raw)


def book_constraints(path: str | Path | None = None) -> Constraints:
    """The line book's banned words, slot rules and slot defaults as
    :class:`~runtime.client.constraints.Constraints` (no vocabulary or signatures: those need the
    expanded book, see :func:`runtime.factory.export.write_constraints`). Reads the YAML
    without expanding templates, so it is fast; ValueError names a file that cannot be read."""
    from runtime.client.constraints import Constraints, SlotRules

    root = Path(path) if path is not None else DEFAULT_PATH
    files = sorted(p for p in root.iterdir() if p.suffix in (".yaml", ".yml")) if root.is_dir() else [root]
    banned: list[str] = []
    slots: list[str] = []
    defaults: dict[str, str] = {}
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
        defaults.update({str(k): str(v) for k, v in (doc.get("slot_defaults") or {}).items()})
        for section, table in rules.items():
            for name, spec in (doc.get(section) or {}).items():
                table[str(name)] = frozenset((spec or {}).get("slots") or ()) if isinstance(spec, dict) else frozenset()
    return Constraints(banned, SlotRules(tuple(slots), rules["archetypes"], rules["states"], rules["intents"]),
                       slot_defaults=defaults or None)
