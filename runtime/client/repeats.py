"""A line never says the same sentence twice.

Read blind, the models' served lines that said a sentence twice were rated garbled: "Take care!
Same spot, next lap, if you need me. Same spot, next lap, if you need me." (model v3.3, and v3.4
in the same form: docs/ratings/ab_v34_v33*.csv). The word masks can't see it (every word and
word pair is the book's) and neither can the trigram table (every trigram is too). The rule,
one for the engine (:class:`runtime.client.generator.LineGenerator`, checked at each sentence
end while a line is decoded), the GPU dialogue service (on the finished line) and the
evaluation (:class:`runtime.factory.evaluate.Sampler`): a line whose complete sentence has the
same words, in the same order, as an earlier sentence of it is drawn again from the sentence
before the repeat, and falls back to an authored line when every draw repeats.

Sentences are what ends at ``.``, ``!``, ``?`` or ``...``; words are compared lower-cased,
without punctuation or ``{slot}`` braces. A sentence of fewer than :data:`MIN_WORDS` words may
repeat: "Run! Run!" and "Pinch, kick, and run! Pinch, kick, and run!" (the book's, a child's
chant in a brawl) are how people shout; no line of the default book says a longer sentence twice
(tests/runtime/client/test_repeats.py).
"""

from __future__ import annotations

import re

MIN_WORDS = 5
"""The fewest words a sentence has for saying it again to count as a repeat."""

_SENTENCE = re.compile(r"[^.!?…]+(?:\.\.\.|…|[.!?]+)")
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)*")


def sentence_words(sentence: str) -> tuple[str, ...]:
    """The words of ``sentence`` as the rule compares them (lower-cased, no punctuation)."""
    return tuple(_WORD.findall(sentence.lower()))


def repeated_sentence(text: str) -> tuple[int, int] | None:
    """``(start, end)``: the offsets in ``text`` of its first complete sentence of at least
    :data:`MIN_WORDS` words that has the words of an earlier one (``start`` at its first
    non-space character), or None. An unfinished last sentence is not read."""
    seen: set[tuple[str, ...]] = set()
    for m in _SENTENCE.finditer(text):
        words = sentence_words(m.group())
        if len(words) < MIN_WORDS:
            continue
        if words in seen:
            lead = len(m.group()) - len(m.group().lstrip())
            return m.start() + lead, m.end()
        seen.add(words)
    return None


__all__ = ["MIN_WORDS", "repeated_sentence", "sentence_words"]
