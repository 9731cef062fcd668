"""What the line book says to one prompt asked again and again (LineBook.lines_for): the book's own
reference for the model's "distinct-2 within 50 seeds of one prompt"."""

from __future__ import annotations

import pytest

from runtime.factory.linebook import load_line_book
from runtime.factory.writer_eval import LineJudge

NIGHT_GUARD = ("guard", "alert", "greet", ("gruff",), (("time_of_day", "night"), ("weather", "rain")))


@pytest.fixture(scope="module")
def book():
    return load_line_book()  # the session's shared default book (tests/conftest.py)


def test_lines_for_a_prompt_are_distinct_and_seeded(book):
    arch, state, intent, persona, context = NIGHT_GUARD
    lines = book.lines_for(arch, state, intent, persona, context, n=50, seed=0)
    assert len(lines) == 50 and len(set(lines)) == 50
    assert book.lines_for(arch, state, intent, persona, context, n=50, seed=0) == lines
    other = book.lines_for(arch, state, intent, persona, context, n=50, seed=1)
    assert other != lines
    assert book.lines_for(arch, state, intent, persona, context, n=5, seed=0) != []


def test_lines_for_a_prompt_fit_it(book):
    """No other value of an asked slot, no other archetype's voice, no trait not asked for,
    nothing the writer measures flag: the book's lines for a prompt are what its expansion
    writes for that prompt."""
    judge = LineJudge(book)
    trait_tags = {f"persona:{t}" for t in book.persona_traits}
    for arch, state, intent, persona, context in [
        NIGHT_GUARD,
        ("merchant", "working", "trade", (), (("weather", "snow"),)),
        ("child", "friendly", "threaten", ("shy", "kind"), ()),
    ]:
        request = (arch, persona, state, intent, context)
        lines = book.lines_for(arch, state, intent, persona, context, n=40, seed=3)
        assert len(lines) >= 20, (request, len(lines))
        for line in lines:
            verdict = judge.verdict(request, line)
            assert verdict.problems() == [], (request, line, verdict.problems())
            unasked = {t for t in judge.signatures.hits(line) if t in trait_tags} - {f"persona:{t}" for t in persona}
            assert not unasked, (request, line, unasked)


@pytest.mark.parametrize(("args", "needle"), [
    (("guardd", "alert", "greet"), "unknown archetype 'guardd'; known: guard"),
    (("guard", "alrt", "greet"), "unknown state 'alrt'; known: alert"),
    (("guard", "alert", "greet", ("grumpy",)), "unknown persona trait 'grumpy'"),
    (("guard", "alert", "greet", (), (("weathr", "rain"),)), "unknown context slot 'weathr'; known: weather"),
    # the engine's request check (runtime.tokenizer.check_request) names the slot and the value
    (("guard", "alert", "greet", (), (("weather", "sunny"),)), "unknown value for context slot 'weather' 'sunny'"),
])
def test_lines_for_names_what_it_does_not_know(book, args, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        book.lines_for(*args)
