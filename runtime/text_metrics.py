"""Pure text metrics used by the evaluation: diversity, novelty, safety, slot use."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

_TOKEN = re.compile(r"\{\w+\}|\w+(?:'\w+)?|[^\w\s]")
_SLOT = re.compile(r"\{(\w+)\}")
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def distinct_n(texts: Sequence[str], n: int = 2) -> float:
    """Distinct n-grams over all n-grams in ``texts`` (word level, case-insensitive); 0 if none."""
    total = 0
    seen: set[tuple[str, ...]] = set()
    for text in texts:
        tokens = _TOKEN.findall(text.lower())
        grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
        total += len(grams)
        seen.update(grams)
    return len(seen) / total if total else 0.0


def novelty(texts: Sequence[str], known: set[str]) -> float:
    """Fraction of ``texts`` that are not verbatim (after whitespace normalisation) in ``known``."""
    if not texts:
        return 0.0
    normalised = {" ".join(k.split()) for k in known}
    return sum(" ".join(t.split()) not in normalised for t in texts) / len(texts)


def banned_hits(text: str, banned_words: Iterable[str]) -> list[str]:
    """Banned words (whole words or whole phrases, case-insensitive) that occur in ``text``."""
    words = _WORD.findall(text.lower())
    joined = " " + " ".join(words) + " "
    hits = []
    for banned in banned_words:
        needle = " " + " ".join(_WORD.findall(banned.lower())) + " "
        if needle.strip() and needle in joined:
            hits.append(banned)
    return hits


def slots_used(text: str) -> set[str]:
    """Names of the ``{slot}`` markers in a generated line."""
    return set(_SLOT.findall(text))


def slot_violations(text: str, allowed: set[str]) -> set[str]:
    """Slot markers in ``text`` that the line book does not allow for the request."""
    return slots_used(text) - set(allowed)
