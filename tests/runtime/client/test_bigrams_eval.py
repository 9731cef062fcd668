"""The evaluation's "unseen bigram lines" (runtime.factory.writer_eval), on the hand-made stand-in
book, where the joins a line makes can be worked out by hand."""

from __future__ import annotations

from runtime.factory.text_metrics import unseen_bigrams
from runtime.factory.writer_eval import FIGURES, LineJudge, book_pairs, text_figures
from tests.runtime.factory.standin_book import StandinBook, standin_line

GUARD = ("guard", ("gruff",), "alert", "greet", (("time_of_day", "night"), ("weather", "rain")))


def test_unseen_bigrams_are_read_inside_sentence_pieces_with_slots_as_words():
    seen = {("the", "gate"), ("{player}", "stop")}
    assert unseen_bigrams("The gate, gate the. {player} stop!", seen) == ["gate the"]
    assert unseen_bigrams("Stop {player} the gate", seen) == ["stop {player}", "{player} the"]
    assert unseen_bigrams("Gate. The, gate!", seen) == []  # no join across a piece mark


def test_the_judge_counts_lines_joining_words_the_book_never_joins():
    book = StandinBook()
    judge = LineJudge(book)
    line = standin_line(GUARD)
    assert judge.verdict(GUARD, line).unseen_bigrams == []
    words = line.rstrip(".").split()
    swapped = " ".join([words[0], *reversed(words[1:])]) + "."
    bad = judge.verdict(GUARD, swapped)
    assert bad.unseen_bigrams and bad.fluent == judge.verdict(GUARD, swapped).fluent  # (not part of fluent)
    figures = text_figures(judge, [GUARD, GUARD, GUARD, GUARD], [line, swapped, line, line])
    assert figures["unseen_bigram_rate"] == 0.25
    assert ("unseen_bigram_rate", "unseen bigram lines") in FIGURES


def test_the_held_out_reference_table_leaves_the_held_out_lines_out():
    book = StandinBook()
    every = [e.text for e in book.examples()]
    assert all(not unseen_bigrams(text, book_pairs(book)) for text in every)
    assert book_pairs(book, leave_out=set(every)) == set()
    held = {e.text for e in book.split().heldout}
    assert book_pairs(book, leave_out=held) <= book_pairs(book)
