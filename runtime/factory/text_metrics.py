"""Pure text metrics used by the evaluation: diversity, novelty, safety, slot use, and what a
writer sees (words the book never says, punctuation and stutter glitches, the tags a line voices)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Collection, Iterable, Mapping, Sequence

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


# ---------------------------------------------------------------- what a writer sees
#
# A "word" here is what the line book's vocabulary counts: lower-cased ``[a-z]+`` with an inner
# apostrophe; ``{slot}`` markers are not words (and no phrase runs across one).

GLITCH_KINDS = ("double_punct", "double_word", "stutter", "space_before_punct", "lowercase_start",
                "a_an", "slot_possessive")
_PUNCT_RUN = re.compile(r"[.,!?;:](?:\s*[.,!?;:])+")
_SPACE_PUNCT = re.compile(r"\s[.,!?;:]")
_LOWER_START = re.compile(r"(?:^|[.!?]\s+)[a-z]")
_REPEATED_CHUNK = re.compile(r"([a-z]{2,})\1|([a-z])\2\2")
_A_AN = re.compile(r"\b(a|an) ([a-z]+)")
_SLOT_GLUED = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}['\u2019]")
_AN_BEFORE = ("hour", "honest", "honor", "honour", "heir", "herb")  # a silent h
_A_BEFORE = ("one", "once", "use", "usu", "uni", "eur", "ewe")  # a vowel letter, a consonant sound


def _a_an_wrong(text: str) -> bool:
    for m in _A_AN.finditer(text.lower()):
        art, word = m.group(1), m.group(2)
        vowel = word[0] in "aeiou"
        if art == "a" and vowel and not word.startswith(_A_BEFORE):
            return True
        if art == "an" and not vowel and not word.startswith(_AN_BEFORE):
            return True
    return False


def words(text: str) -> list[str]:
    """The words of ``text`` (lower case), slot markers left out."""
    return _WORD.findall(_SLOT.sub(" ", text).lower())


def nonwords(text: str, vocabulary: Collection[str]) -> list[str]:
    """Words of ``text`` that are not in ``vocabulary`` (in order, repeats kept)."""
    return [w for w in words(text) if w not in vocabulary]


def glitches(text: str, vocabulary: Collection[str] = ()) -> list[str]:
    """The kinds of punctuation and stutter glitch in ``text`` (each once, in GLITCH_KINDS order).

    * ``double_punct``: two or more of ``. , ! ? ; :`` in a row, spaces between them or not
      (``",,"``, ``"!."``, ``".,"``, ``"?!."``, ``". ,"``), except an ellipsis of exactly three
      dots, which the line book writes;
    * ``double_word``: the same word (or slot marker) twice with only spaces between
      (``"the the"``; ``"I-I"`` is a written stutter, not a glitch);
    * ``stutter``: a word the ``vocabulary`` does not hold with a chunk of two or more letters
      repeated back to back, or one letter three times (``"woororor"``, ``"gatgate"``,
      ``"moooor"``); words the book says (``"murmur"``, ``"mmm"``) never count;
    * ``space_before_punct``: a space before ``. , ! ? ; :``;
    * ``lowercase_start``: the line or a sentence (after ``. ! ?`` and a space) starts with a
      lower-case letter;
    * ``a_an``: "a" before a vowel or "an" before a consonant ("a oaf", "an wretch"), save the
      usual exceptions ("an hour", "a one");
    * ``slot_possessive``: an apostrophe glued to a ``{slot}`` marker (``"{location}'s way"``):
      the game fills the slot with its own text, which can end in "s" or be a phrase ("the
      fields's way", "a lantern'll do").
    """
    found = set()
    if any(run.group(0) != "..." for run in _PUNCT_RUN.finditer(text)):
        found.add("double_punct")
    tokens = _TOKEN.findall(text.lower())  # anything but a space between words is a token
    if any(a == b and (a[0].isalnum() or a[0] == "{") for a, b in itertools.pairwise(tokens)):
        found.add("double_word")
    if any(w not in vocabulary and _REPEATED_CHUNK.search(w) for w in words(text)):
        found.add("stutter")
    if _SPACE_PUNCT.search(text):
        found.add("space_before_punct")
    if _LOWER_START.search(text):
        found.add("lowercase_start")
    if _a_an_wrong(text):
        found.add("a_an")
    if _SLOT_GLUED.search(text):
        found.add("slot_possessive")
    return [k for k in GLITCH_KINDS if k in found]


def unseen_bigrams(text: str, seen: Collection[tuple[str, str]]) -> list[str]:
    """The word bigrams of ``text`` inside one sentence piece that ``seen`` does not hold, as
    ``"word word"`` (in order, repeats kept). Pieces and words are read as the decoding's bigram
    table reads them (:func:`runtime.client.bigrams.piece_words`: pieces split at ``. ! ? , ; :``
    and ``…``, ``{slot}`` markers count as words), so pass the line with its markers kept."""
    from runtime.client.bigrams import bigram_pairs

    return [f"{a} {b}" for a, b in bigram_pairs(text) if (a, b) not in seen]


class SignatureIndex:
    """Finds which tags' signature phrases a line says.

    ``signatures`` maps a tag (``"archetype:guard"``, ``"persona:gruff"``,
    ``"context:weather=rain"``) to phrases of lower-case words; a phrase is said when its words
    follow one another in the line, whatever punctuation sits between them, within one stretch
    between slot markers (as the line book finds them in its fragments).
    """

    def __init__(self, signatures: Mapping[str, Iterable[str]]) -> None:
        self._tags: dict[tuple[str, ...], set[str]] = {}
        for tag, phrases in signatures.items():
            for phrase in phrases:
                key = tuple(_WORD.findall(phrase.lower()))
                if key:
                    self._tags.setdefault(key, set()).add(tag)
        self._longest = max((len(k) for k in self._tags), default=0)

    def hits(self, text: str) -> set[str]:
        """Every tag with a signature phrase in ``text``."""
        found: set[str] = set()
        for piece in _SLOT.split(text)[::2]:  # split() puts each marker's name at the odd places
            ws = _WORD.findall(piece.lower())
            for n in range(1, self._longest + 1):
                for i in range(len(ws) - n + 1):
                    found.update(self._tags.get(tuple(ws[i : i + n]), ()))
        return found
