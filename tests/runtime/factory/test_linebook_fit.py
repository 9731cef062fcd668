"""Composed lines that don't read stitched: the repetition rule across a line's parts, and the
writer's marks (not_with, only_with, at) that keep a fragment away from the intents, states and
places in a line it clashes with (docs/linebook.md, "Where a fragment fits")."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.factory.linebook import load_line_book, repeated_word
from tests.runtime.factory.test_linebook_format import MINI, error_for, line_of, write


@pytest.mark.parametrize(("parts", "word"), [
    (["Work's stacked up high.", "The only news here is work piling up."], "work"),
    (["Buying, selling, all of it can wait.", "The taps can wait."], "wait"),
    (["I wait.", "It waits for nobody."], "waits"),
    (["Working hard.", "Back to work, then."], "work"),
    (["Taking my ease outside.", "Forgive the bare feet, I'm taking my ease."], "taking"),
    (["Nice stories.", "Tell me a story."], "story"),
    (["Hello, {player}.", "Farewell, {player}."], None),  # slots are not words
    (["I am here, and it's all yours.", "There, that's it; you're in."], None),  # common words only
    (["Work hard.", "Rest easy."], None),
])
def test_repeated_word_compares_simple_stems_outside_the_common_words(parts: list[str], word: str | None) -> None:
    assert repeated_word(parts) == word


def test_repetition_within_one_part_is_the_writers_choice() -> None:
    assert repeated_word(["Work, work, and more work."]) is None


REPEAT = MINI.replace('codas: ["So (dull|slow)."]', 'codas: ["Working all day, me."]').replace(
    'greet: ["Hello, {player}."]', 'greet: ["Hello, {player}.", "Hello, {player}, the work waits."]').replace(
    '  - pattern: "[lead] [coda] [tag]"\n    tones: [calm]\n',
    '  - pattern: "[reply] [coda]"\n    weight: 4\n    tones: [calm]\n')


def test_a_line_whose_parts_share_a_content_word_is_dropped_and_linted_with_its_fragments(tmp_path: Path) -> None:
    book = load_line_book(write(tmp_path, REPEAT))
    texts = [e.text for e in book.examples()]
    assert not [t for t in texts if "work waits" in t and "Working" in t]
    assert any(t.endswith("Working all day, me.") and "Hello, {player}." in t for t in texts)
    problems = [p for p in book.lint() if p.problem == "repeats 'working' across its parts"]
    assert problems
    reply, coda = f":{line_of(REPEAT, 'the work waits')}", f":{line_of(REPEAT, 'Working all day')}"
    for p in problems:
        assert any(s.endswith(reply) for s in p.sources) and any(s.endswith(coda) for s in p.sources)
        assert "work waits" in p.text and "Working" in p.text


MARKS = MINI.replace('calm: ["Hmph."]', 'calm: ["Hmph.", {text: "Get to the point.", not_with: [greet]}]').replace(
    'calm: ["Fair winds."]', 'calm: [{text: "Fair winds.", only_with: [ask_directions]}]').replace(
    'calm: ["Bless you."]', 'calm: [{text: "Bless you.", at: end}]').replace(
    '  - pattern: "[lead] [coda] [tag]"\n',
    '  - pattern: "[lead] [reply] [mood]"\n  - pattern: "[lead] [reply] [tag]"\n    weight: 3\n'
    '  - pattern: "[lead] [coda] [tag]"\n').replace(
    'greet: ["Hello, {player}."]', 'greet: ["Hello there.", "Well met."]').replace("per_condition: 12", "per_condition: 40")


def test_not_with_keeps_a_fragment_from_the_intents_it_names(tmp_path: Path) -> None:
    examples = load_line_book(write(tmp_path, MARKS)).examples()
    with_it = [e for e in examples if "Get to the point." in e.text]
    assert with_it and {e.intent for e in with_it} == {"ask_directions"}
    assert any("Hmph." in e.text for e in examples if e.intent == "greet")


def test_only_with_draws_a_fragment_for_its_intents_alone_and_no_pattern_goes_empty(tmp_path: Path) -> None:
    examples = load_line_book(write(tmp_path, MARKS)).examples()
    with_it = [e for e in examples if "Fair winds." in e.text]
    assert with_it and {(e.archetype, e.intent) for e in with_it} == {("sailor", "ask_directions")}
    # a sailor's greet line has no tag to draw: the [tag] patterns are left out, not drawn empty
    for e in examples:
        if e.archetype == "sailor" and e.intent == "greet" and e.state == "idle":
            assert e.text.endswith((".", "!", "?")) and "  " not in e.text


def test_at_end_draws_a_fragment_only_as_the_last_part_of_a_line(tmp_path: Path) -> None:
    examples = load_line_book(write(tmp_path, MARKS)).examples()
    with_it = [e for e in examples if "Bless you." in e.text]
    assert with_it and all(e.text.endswith("Bless you.") for e in with_it)
    # "[mood] [lead] [reply] [ctx]" has nothing to open with for a kind-only persona: not drawn
    assert not any(e.text.startswith("Bless you.") for e in examples)


@pytest.mark.parametrize(("old", "new", "field", "problem"), [
    ('calm: ["Hmph."]', 'calm: [{text: "Hmph.", not_with: [gret]}]',
     "persona_traits.gruff.calm[0].not_with[0]", "unknown intent or state 'gret'; known: greet"),
    ('calm: ["Hmph."]', 'calm: [{text: "Hmph.", only_with: []}]',
     "persona_traits.gruff.calm[0].only_with", "needs at least one intent or state"),
    ('calm: ["Hmph."]', 'calm: [{text: "Hmph.", not_with: [greet], only_with: [greet]}]',
     "persona_traits.gruff.calm[0].only_with", "'greet' is also in not_with"),
    ('calm: ["Hmph."]', 'calm: [{text: "Hmph.", at: middle}]',
     "persona_traits.gruff.calm[0].at", "unknown position 'middle'; known: start, end"),
    ('calm: ["Hmph."]', 'calm: [{txt: "Hmph."}]',
     "persona_traits.gruff.calm[0].txt", "unknown field; known: text, not_with, only_with, at"),
    ('calm: ["Hmph."]', 'calm: [{not_with: [greet]}]',
     "persona_traits.gruff.calm[0].text", "required field is missing"),
    ('address: ["citizen", "stranger"]', 'address: ["citizen", {text: "stranger", at: end}]',
     "archetypes.guard.voice.address[1].at", "'at' is for fragments drawn as a whole part"),
    ('greet: ["Hello, {player}."]', 'greet: [{text: "Hello, {player}.", not_with: [alert]}]',
     "replies.idle.greet[0]", "expected a string"),
    ('address: ["matey"]', 'address: [{text: "matey", not_with: [alert]}]',
     "archetypes.sailor.voice.address[0]", "no entry may be drawn for state 'alert' and intent 'greet'"),
])
def test_a_bad_mark_is_an_error_naming_file_line_and_field(tmp_path: Path, old: str, new: str, field: str,
                                                           problem: str) -> None:
    text = MINI.replace(old, new)
    assert text != MINI
    err = error_for(tmp_path, text)
    assert err.field == field and problem in err.problem, str(err)
    assert err.line == line_of(text, new.split('"')[1] if '"' in new else new)


def test_a_mark_that_excludes_nothing_changes_no_draw(tmp_path: Path) -> None:
    same = MINI.replace('calm: ["Hmph."]', 'calm: [{text: "Hmph.", only_with: [idle, alert]}]')
    assert load_line_book(write(tmp_path, same)).examples() == load_line_book(write(tmp_path, MINI, "b.yaml")).examples()


def test_a_compose_pattern_marked_not_with_is_not_drawn_for_those_intents(tmp_path: Path) -> None:
    marked = MINI.replace('  - pattern: "[mood] [lead] [reply] [ctx]"\n',
                          '  - pattern: "[mood] [lead] [reply] [ctx]"\n    not_with: [ask_directions]\n').replace(
        'greet: ["Hello, {player}."]', 'greet: ["Hello there."]')
    examples = load_line_book(write(tmp_path, marked)).examples()
    assert any("Hmph." in e.text for e in examples)  # the pattern's only [mood]
    assert not any("Hmph." in e.text or "raining" in e.text for e in examples if e.intent == "ask_directions")


def test_compose_marks_that_leave_a_state_and_intent_no_pattern_are_an_error(tmp_path: Path) -> None:
    text = MINI.replace('  - pattern: "[lead] [reply]"\n', '  - pattern: "[lead] [reply]"\n    not_with: [alert]\n').replace(
        '  - pattern: "[mood] [lead] [reply] [ctx]"\n', '  - pattern: "[mood] [lead] [reply] [ctx]"\n    only_with: [idle]\n')
    err = error_for(tmp_path, text)
    assert err.field == "compose[0].pattern" and err.line == line_of(text, '"[lead] [reply]"')
    assert "no compose pattern may be drawn for state 'alert' and intent 'greet'" in err.problem
