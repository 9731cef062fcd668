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

Sentences and words are the trigram check's (:func:`runtime.client.trigrams.line_tokens`: a
sentence ends at a run of ``. ! ? ...``, words are the vocabulary's, lower-cased); a ``{slot}``
compares as its name. A sentence of fewer than :data:`MIN_WORDS` words may repeat: "Run! Run!"
and "Pinch, kick, and run! Pinch, kick, and run!" (the book's, a child's chant in a brawl) are
how people shout; no line of the default book says a longer sentence twice
(tests/runtime/client/test_repeats.py).
"""

from __future__ import annotations

from collections.abc import Iterator

from runtime.client.trigrams import SENTENCE_ENDS, line_tokens

MIN_WORDS = 5
"""The fewest words a sentence has for saying it again to count as a repeat."""

ENDS_A_SENTENCE = (".", "!", "?", "\u2026")
"""What a line's text ends with when its last token may have ended a sentence: a decoder need
call :func:`repeated_sentence` only then."""


def _is_word(tok: str) -> bool:
    return tok[0].isalnum() or tok[0] == "{"


def sentence_words(sentence: str) -> tuple[str, ...]:
    """The words of ``sentence`` as the rule compares them (lower-cased, no punctuation)."""
    return tuple(tok.strip("{}") for tok, _end in line_tokens(sentence) if _is_word(tok))


def _sentences(text: str) -> Iterator[tuple[int, int, tuple[str, ...]]]:
    """Each complete sentence of ``text``: its start, its end (after its run of end marks) and
    its words."""
    words: list[str] = []
    start: int | None = None
    end: int | None = None  # set once the sentence under way has an end mark
    for tok, tok_end in line_tokens(text):
        if tok in SENTENCE_ENDS:
            end = tok_end
            continue
        if end is not None:  # the run of end marks is over
            yield start or 0, end, tuple(words)
            words, start, end = [], None, None
        if start is None:
            start = tok_end - len(tok)
        if _is_word(tok):
            words.append(tok.strip("{}"))
    if end is not None:
        yield start or 0, end, tuple(words)


def repeated_sentence(text: str) -> tuple[int, int] | None:
    """``(start, end)``: the offsets in ``text`` of its first complete sentence of at least
    :data:`MIN_WORDS` words that has the words of an earlier one (``start`` at its first
    token), or None. An unfinished last sentence is not read."""
    seen: set[tuple[str, ...]] = set()
    for start, end, words in _sentences(text):
        if len(words) < MIN_WORDS:
            continue
        if words in seen:
            return start, end
        seen.add(words)
    return None


__all__ = ["ENDS_A_SENTENCE", "MIN_WORDS", "repeated_sentence", "sentence_words"]
