"""What a writer is warned about: template artifacts in an expanded line, repeated words, unknown
names with the closest known first.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

from runtime.factory.linebook.types import _COMMON, _SLOT_RE, _words
from runtime.factory.text_metrics import glitches


def _stem(word: str) -> str | None:
    """A simple stem of a lower-case word for the repetition rule, or None for a word too common
    to count (:data:`_COMMON`, also behind a contraction: "that's", "don't"): "work", "working",
    "worked" and "work's" all give "work"; "wait" and "waits" give "wait"; "stories" "story"."""
    if word in _COMMON:
        return None
    base = re.sub(r"(n't|'s|'ll|'re|'ve|'d|'m)$", "", word)
    if base in _COMMON or not base:
        return None
    if base.endswith("ies") and len(base) > 4:
        base = base[:-3] + "y"
    else:
        for suffix in ("ing", "ed", "es", "s"):
            if base.endswith(suffix) and len(base) - len(suffix) >= 3 and not base.endswith("ss"):
                base = base[: -len(suffix)]
                break
    if len(base) > 3 and base.endswith("e"):
        base = base[:-1]
    if len(base) > 3 and base[-1] == base[-2] and base[-1] not in "aeiouls":
        base = base[:-1]  # "stopp" (stopping) -> "stop"; not "fall", "less"
    return base


def repeated_word(parts: Sequence[str]) -> str | None:
    """The first word of a later part whose stem (:func:`_stem`) an earlier part of the same line
    already said, or None: "Work's stacked up high." + "The only news is work piling up" gives
    "work". Slots and the common words of :data:`_COMMON` do not count. Expansion drops a
    composed line that repeats itself this way and draws again."""
    said: set[str] = set()
    for part in parts:
        words = _words(_SLOT_RE.sub(" ", part))
        stems = {w: _stem(w) for w in words}
        for w in words:
            if stems[w] is not None and stems[w] in said:
                return w
        said.update(st for st in stems.values() if st is not None)
    return None



_SPACE_RE = re.compile(r"\s+")
_SLOT_GLUED_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}['\u2019][A-Za-z]*")
_SPACE_PUNCT_RE = re.compile(r"\s+([,.!?;:])")
_SENTENCE_RE = re.compile(r"(^|[.!?]\s+)([a-z])")


def _normalize(text: str) -> str:
    """Collapse spaces, drop spaces before punctuation, capitalise sentence starts."""
    text = _SPACE_RE.sub(" ", text).strip()
    text = _SPACE_PUNCT_RE.sub(r"\1", text)
    text = re.sub(r",([.!?])", r"\1", text)
    return _SENTENCE_RE.sub(lambda m: m.group(1) + m.group(2).upper(), text)


_SENTENCE_END_RE = re.compile(r"[.!?]+(?=\s|$)")


def sentences(text: str) -> int:
    """How many sentences an expanded line says: its runs of ``.``, ``!`` or ``?`` that end a
    word before a space or the end ("Halt! Who goes there?" is 2, "Wait... what?" 2, "{location}?" 1).
    A compose pattern's ``max_sentences`` keeps to lines of at most that many."""
    return len(_SENTENCE_END_RE.findall(text))


def lint_line(text: str) -> str | None:
    """Why an expanded line reads as a template artifact, or None: the first of the glitches
    :func:`runtime.factory.text_metrics.glitches` finds (doubled punctuation, a doubled word, "a" before
    a vowel, an apostrophe glued to a slot, ...; not "stutter", which is about words outside the
    book), the same measure
    ``flashnpc eval`` applies to model lines. Expansion drops
    such lines; :meth:`LineBook.lint` lists them with the fragments they came from."""
    found = [k for k in glitches(text) if k != "stutter"]  # the book's own words are words
    return found[0].replace("_", " ") if found else None


def _unknown(kind: str, value: str, known: Sequence[str]) -> str:
    return f"unknown {kind} {value!r}; known: {', '.join(closest_first(value, known))}"


def closest_first(value: str, known: Sequence[str]) -> list[str]:
    """``known`` reordered with the closest matches to ``value`` first (difflib)."""
    close = difflib.get_close_matches(value, list(known), n=len(known), cutoff=0.0)
    return close + [k for k in known if k not in close]


def _check_known(kind: str, value: str, known: Sequence[str]) -> None:
    if value not in known:
        raise ValueError(_unknown(kind, value, known))
