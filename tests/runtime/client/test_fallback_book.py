"""The line book's ``fallbacks`` section as FallbackBook reads it: cells per (state, intent) and
per archetype, the documented order, and the validator's and lint's checks of fallback lines."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from runtime.client.fallback import ANY_INTENT, FallbackBook
from runtime.factory.linebook import FALLBACK_MAX_WORDS, load_line_book
from tests.runtime.factory.test_linebook_format import MINI, error_for, line_of, write

CELLS = MINI.replace('''fallbacks:
  idle: ["Bored, [address]."]
  alert: ["Halt!"]
''', '''fallbacks:
  idle:
    any: ["Bored, [address]."]
    greet: ["Hello, [address]. Bored."]
  alert: ["Halt!"]
  sailor:
    idle:
      greet: ["Ahoy, bored."]
    alert:
      any: ["Belay that!"]
''')


def test_cells_resolve_archetype_then_state_for_the_intent_then_the_any_lines(tmp_path: Path) -> None:
    book = load_line_book(write(tmp_path, CELLS))
    cells = book.fallback_cells()
    assert cells[("guard", "idle", "greet")] == ["Hello, citizen. Bored.", "Hello, stranger. Bored."]
    assert cells[("sailor", "idle", "greet")] == ["Ahoy, bored."]  # the archetype's own, first
    assert cells[("sailor", "idle", ANY_INTENT)] == ["Bored, matey."]
    assert cells[("sailor", "alert", ANY_INTENT)] == ["Belay that!"]
    assert cells[("guard", "alert", ANY_INTENT)] == ["Halt!"]
    assert ("guard", "idle", "ask_directions") not in cells  # left to the any lines
    engine = FallbackBook(cells)
    rng = np.random.default_rng(0)
    assert engine.pick("guard", "idle", 1, rng, intent="ask_directions") in cells[("guard", "idle", ANY_INTENT)]
    # every line the engine can say counts as said (vocabulary, bigrams): the any lines first
    assert book.fallback_lines()[("guard", "idle")] == [
        "Bored, citizen.", "Bored, stranger.", "Hello, citizen. Bored.", "Hello, stranger. Bored."]
    assert "ahoy" in book.vocabulary()


def test_a_plain_list_is_a_states_any_lines_as_before(tmp_path: Path) -> None:
    cells = load_line_book(write(tmp_path, MINI)).fallback_cells()
    assert cells == {("guard", "idle", ANY_INTENT): ["Bored, citizen.", "Bored, stranger."],
                     ("guard", "alert", ANY_INTENT): ["Halt!"],
                     ("sailor", "idle", ANY_INTENT): ["Bored, matey."],
                     ("sailor", "alert", ANY_INTENT): ["Halt!"]}


@pytest.mark.parametrize(("old", "new", "field", "at", "problem"), [
    ('greet: ["Hello, [address]', 'greeet: ["Hello, [address]', "fallbacks.idle.greeet", "greeet",
     "unknown intent 'greeet'; known: greet"),
    ('"Hello, [address]. Bored."', '"Hello, {player}. Bored."', "fallbacks.idle.greet[0]", "Hello, {player}. Bored",
     "served as written"),
    ('"Ahoy, bored."', '"Ahoy, it is raining."', "fallbacks.sailor.idle.greet[0]", "it is raining",
     "asserts weather=rain"),
])
def test_a_bad_fallback_is_refused_at_its_line(tmp_path: Path, old: str, new: str, field: str, at: str,
                                               problem: str) -> None:
    """An unknown intent (with the known ones), a slot (fallbacks are served as written), a phrase
    a context value implies (a fallback is served under any context)."""
    text = CELLS.replace(old, new, 1).replace("    rain:\n", "    rain:\n      implies: [raining]\n")
    err = error_for(tmp_path, text)
    assert (err.field, err.line) == (field, line_of(text, at)) and problem in err.problem


def test_a_state_needs_any_lines(tmp_path: Path) -> None:
    text = CELLS.replace('    any: ["Bored, [address]."]\n', "", 1)
    err = error_for(tmp_path, text)
    assert err.field == "fallbacks.idle" and "no fallback lines for this state" in err.problem


def test_lint_lists_long_or_glitched_fallbacks_and_intents_no_fallback_answers(tmp_path: Path) -> None:
    long = "Ahoy, I am far too bored to talk with you or anyone else."
    assert len(long.split()) == FALLBACK_MAX_WORDS + 1
    text = CELLS.replace('"Ahoy, bored."', f'"{long}"').replace('"Belay that!"', '"Belay that that!"')
    problems = load_line_book(write(tmp_path, text)).lint()
    where = f":{line_of(text, long)}"
    assert any(p.text == long and p.problem == f"a fallback over {FALLBACK_MAX_WORDS} words"
               and p.sources[0].endswith(where) for p in problems)
    assert any(p.text == "Belay that that!" and p.problem == "double word" for p in problems)
    gaps = {p.text: p.problem for p in problems if p.text.startswith("fallbacks.")}
    assert set(gaps) == {"fallbacks.idle.ask_directions", "fallbacks.alert.greet", "fallbacks.alert.ask_directions"}
    assert "(guard, sailor)" in gaps["fallbacks.alert.greet"]


def test_the_default_books_fallbacks_are_short_and_clean() -> None:
    book = load_line_book()
    for (arch, state), lines in book.fallback_lines().items():
        for line in lines:
            assert 1 <= len(line.split()) <= FALLBACK_MAX_WORDS, (arch, state, line)
            assert "{" not in line and "[" not in line, line
