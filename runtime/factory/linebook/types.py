"""The line book's shared vocabulary: its constants, its error, and what it gives out (examples,
splits, lint problems).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from runtime.paths import DEFAULT_LINE_BOOK_DIR

DEFAULT_PATH = DEFAULT_LINE_BOOK_DIR

# group names with built-in meaning; every other [group] is an archetype voice group
BUILTIN_GROUPS = ("lead", "coda", "reply", "mood", "ctx", "tag", "own", "own_reply", "trait_reply")
# groups that are whole parts of a line: only compose patterns may draw them
_PART_GROUPS = frozenset(["lead", "coda", "reply", "tag", "own", "own_reply", "trait_reply"])
TONES = ("calm", "urgent")
# a persona trait's voice marker recurs through at least this many of its whole replies
VOICE_MARKER_MIN_TEMPLATES = 3
FALLBACK_MAX_WORDS = 12
"""The most words a fallback line should say (:meth:`LineBook.lint` lists longer ones): it
stands in for a line the model missed, so it is short."""
_SLOT_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_WORD_RE = re.compile(r"[A-Za-z']+")
# a word as the decoding constraints count it (runtime.client.constraints._WORD), on lower-cased text
_VOCAB_WORD_RE = re.compile(r"[a-z]+(?:'[a-z]+)?")


# words too common to tell a tag apart on their own: a signature needs one other word
_COMMON = frozenset(["a", "an", "the", "and", "or", "but", "so", "if", "as", "at", "by", "for", "from", "in", "into", "of", "off", "on", "onto", "out", "over", "to", "up", "with", "i", "i'm", "i've", "i'll", "me", "my", "mine", "we", "we're", "us", "our", "you", "you're", "your", "yours", "he", "she", "it", "it's", "its", "they", "them", "their", "this", "that", "these", "those", "is", "are", "was", "were", "be", "been", "am", "do", "does", "did", "have", "has", "had", "not", "no", "now", "here", "there", "then", "what", "who", "how", "why", "oh", "ah", "eh", "well", "just", "all", "too", "very", "can", "can't", "will", "won't"])


def _words(text: str) -> list[str]:
    """The words of ``text`` as the vocabulary and the signatures count them (lower case)."""
    return _VOCAB_WORD_RE.findall(text.lower())



class LineBookError(ValueError):
    """A malformed line book. ``str()`` is ``"<file>:<line>: <field>: <problem>"``."""

    def __init__(self, file: str, line: int, field: str, problem: str) -> None:
        self.file = str(file)
        self.line = int(line)
        self.field = field
        self.problem = problem
        super().__init__(f"{self.file}:{self.line}: {field}: {problem}")


@dataclass(frozen=True)
class Example:
    """One expanded training line and the prompt it answers."""

    archetype: str
    persona: tuple[str, ...]  # sorted persona trait names (0-2 traits)
    state: str
    intent: str
    context: tuple[tuple[str, str], ...]  # sorted (slot, value) pairs: any subset of the slots
    text: str  # the line; may contain free-text slot markers such as {player}


@dataclass(frozen=True)
class LintProblem:
    """An expanded line that reads as a template artifact, and the fragments it came from."""

    text: str
    problem: str
    sources: tuple[str, ...]  # "file:line" of each fragment drawn, in order

    def __str__(self) -> str:
        return f"{', '.join(self.sources)}: {self.problem}: {self.text!r}"


@dataclass(frozen=True)
class Split:
    """A deterministic partition of :meth:`LineBook.examples`.

    ``heldout`` holds every example of ``heldout_pairs`` (archetype, state): none of those
    pairs, and none of their texts, appear in ``train``, ``val`` or ``test``.
    """

    train: list[Example]
    val: list[Example]
    test: list[Example]
    heldout: list[Example]
    heldout_pairs: list[tuple[str, str]]


# ---------------------------------------------------------------- templates


@dataclass(frozen=True)
class _Where:
    file: str
    line: int
    field: str

    def error(self, problem: str) -> LineBookError:
        return LineBookError(self.file, self.line, self.field, problem)
