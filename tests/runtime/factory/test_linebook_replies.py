"""Whole replies: ``own_replies`` (archetype voice) and ``trait_replies`` (persona voice), drawn as
``[own_reply]`` / ``[trait_reply]`` for their (state, intent) cell only."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.factory.linebook import LineBookError, load_line_book
from tests.runtime.factory.test_linebook_format import MINI, error_for, line_of, write

OWN_REPLIES = """\
own_replies:
  guard:
    idle:
      greet:
        - "Evening watch is dull, [address], but hello to you."
        - {text: "Gatepost and me, we bid you (good day|hello).", at: start}
    alert:
      ask_directions: ["Why would a stranger want {location}? Speak up."]
"""
TRAIT_REPLIES = """\
trait_replies:
  gruff:
    idle:
      greet: ["Hmph. Hello yourself, [address]."]
"""
PATTERNS = """\
  - pattern: "[own_reply]"
    weight: 5
  - pattern: "[trait_reply]"
    weight: 5
"""


def book_text(*sections: str) -> str:
    return MINI.replace("compose:\n", "".join(sections) + "compose:\n" + PATTERNS)


def test_an_own_reply_is_drawn_whole_for_its_archetype_state_and_intent_only(tmp_path: Path) -> None:
    examples = load_line_book(write(tmp_path, book_text(OWN_REPLIES))).examples()
    mine = {e.text for e in examples if (e.archetype, e.state, e.intent) == ("guard", "idle", "greet")}
    # drawn alone, the line is the reply itself, its voice group filled with the guard's address
    assert {"Evening watch is dull, citizen, but hello to you.",
            "Evening watch is dull, stranger, but hello to you.",
            "Gatepost and me, we bid you good day.", "Gatepost and me, we bid you hello."} <= mine
    assert "Why would a stranger want {location}? Speak up." in {
        e.text for e in examples if (e.archetype, e.state, e.intent) == ("guard", "alert", "ask_directions")}
    for e in examples:
        if "Evening watch" in e.text or "Gatepost" in e.text:
            assert (e.archetype, e.state, e.intent) == ("guard", "idle", "greet"), e
        if "Speak up." in e.text:
            assert (e.archetype, e.state, e.intent) == ("guard", "alert", "ask_directions"), e


def test_a_trait_reply_is_drawn_only_for_a_prompt_carrying_the_trait_in_any_archetypes_voice(
        tmp_path: Path) -> None:
    examples = load_line_book(write(tmp_path, book_text(TRAIT_REPLIES))).examples()
    drawn = [e for e in examples if e.text.startswith("Hmph. Hello yourself")]
    assert {e.archetype for e in drawn} == {"guard", "sailor"}
    assert {"Hmph. Hello yourself, matey.", "Hmph. Hello yourself, citizen."} <= {e.text for e in drawn}
    for e in drawn:
        assert "gruff" in e.persona and (e.state, e.intent) == ("idle", "greet"), e
    # a prompt without the trait never gets a [trait_reply] line: only the [reply] patterns speak
    assert any(e.persona == () and (e.state, e.intent) == ("idle", "greet") for e in examples)


def test_a_missing_cell_loads_and_its_pattern_is_not_drawn(tmp_path: Path) -> None:
    book = load_line_book(write(tmp_path, book_text(OWN_REPLIES, TRAIT_REPLIES)))
    missing = book.missing_reply_cells()
    assert "own_replies.guard.idle.ask_directions" in missing and "own_replies.guard.idle.greet" not in missing
    assert "trait_replies.kind.idle.greet" in missing and "trait_replies.gruff.idle.greet" not in missing
    assert len(missing) == (2 + 2) * 2 * 2 - 3
    # the sailor has no own replies: its lines come from the other patterns
    sailor = [e for e in book.examples() if e.archetype == "sailor"]
    assert any((e.state, e.intent) == ("idle", "greet") for e in sailor)
    assert not any("Evening watch" in e.text or "Gatepost" in e.text for e in sailor)


def test_a_cell_may_be_split_across_files_but_not_written_twice(tmp_path: Path) -> None:
    write(tmp_path, book_text(), "00_book.yaml")
    write(tmp_path, OWN_REPLIES, "26_a.yaml")
    other = "own_replies:\n  guard:\n    idle:\n      ask_directions: [\"{location}? Past the gate.\"]\n"
    write(tmp_path, other, "26_b.yaml")
    book = load_line_book(tmp_path)
    assert "own_replies.guard.idle.ask_directions" not in book.missing_reply_cells()
    twice = "own_replies:\n  guard:\n    idle:\n      greet: [\"Hello again.\"]\n"
    path = write(tmp_path, twice, "26_c.yaml")
    with pytest.raises(LineBookError) as info:
        load_line_book(tmp_path)
    err = info.value
    assert (err.file, err.line, err.field) == (str(path), 4, "own_replies.guard.idle.greet")
    assert f"already defined at {tmp_path / '26_a.yaml'}:{line_of(OWN_REPLIES, 'greet:')}" in err.problem


@pytest.mark.parametrize(("old", "new", "field", "problem"), [
    ("  guard:\n    idle:", "  gaurd:\n    idle:", "own_replies.gaurd", "unknown archetype 'gaurd'; known: guard"),
    ("    alert:\n      ask_directions", "    alret:\n      ask_directions", "own_replies.guard.alret",
     "unknown state 'alret'; known: alert"),
    ("      ask_directions: [", "      ask_direction: [", "own_replies.guard.alert.ask_direction",
     "unknown intent 'ask_direction'; known: ask_directions"),
    ("  gruff:\n    idle:", "  gruf:\n    idle:", "trait_replies.gruf", "unknown persona trait 'gruf'; known: gruff"),
    ("dull, [address], but hello", "dull, {location}, but hello", "own_replies.guard.idle.greet[0]",
     "slot {location} is not allowed here"),
    ("dull, [address], but hello", "dull, [lead], but hello", "own_replies.guard.idle.greet[0]",
     "may only use the archetype's voice groups"),
    ("Hello yourself, [address].", "Okay yourself.", "trait_replies.gruff.idle.greet[0]", "banned word 'okay'"),
    ("at: start}", "at: middle}", "own_replies.guard.idle.greet[1].at", "unknown position 'middle'"),
])
def test_a_bad_whole_reply_is_an_error_naming_file_line_and_field(tmp_path: Path, old: str, new: str, field: str,
                                                                  problem: str) -> None:
    text = book_text(OWN_REPLIES, TRAIT_REPLIES)
    assert old in text
    text = text.replace(old, new, 1)
    path = write(tmp_path, text)
    with pytest.raises(LineBookError) as info:
        load_line_book(path)
    err = info.value
    assert err.file == str(path) and err.field == field and problem in err.problem, str(err)
    assert err.line == line_of(text, new.split("\n")[0].strip())


def test_a_trait_reply_may_use_only_the_voice_groups_every_archetype_defines(tmp_path: Path) -> None:
    text = book_text(TRAIT_REPLIES).replace('      address: ["matey"]', '      address: ["matey"]\n'
                                            '      oath: ["Blow me down!"]')
    text = text.replace('address: ["citizen", "stranger"]', 'address: ["citizen", "stranger"]\n'
                        '      oath: ["By the wall!"]')
    load_line_book(write(tmp_path, text.replace("Hello yourself, [address].", "[oath] Hello yourself.")))
    only_sailor = text.replace('      oath: ["By the wall!"]\n', "").replace(
        "Hello yourself, [address].", "Hello yourself, [address]. [oath]")
    with pytest.raises(LineBookError) as info:
        load_line_book(write(tmp_path, only_sailor))
    assert info.value.field == "trait_replies.gruff.idle.greet[0]"
    assert "voice groups every archetype defines ([address]); [oath] is not one" in info.value.problem


def test_a_context_word_in_a_whole_reply_is_an_error(tmp_path: Path) -> None:
    text = book_text(OWN_REPLIES, TRAIT_REPLIES).replace(
        'rain:\n      calm: ["It is raining."]', 'rain:\n      implies: [raining, wet]\n      calm: ["It is raining."]')
    load_line_book(write(tmp_path, text))
    for old, new, field in (("Evening watch is dull", "Evening watch is wet", "own_replies.guard.idle.greet[0]"),
                            ("Hello yourself", "Wet yourself", "trait_replies.gruff.idle.greet[0]")):
        with pytest.raises(LineBookError) as info:
            load_line_book(write(tmp_path, text.replace(old, new)))
        assert info.value.field == field and "asserts weather=rain" in info.value.problem


def test_whole_replies_make_no_signatures_of_their_own_but_unmake_other_tags(tmp_path: Path) -> None:
    """A whole reply's everyday words ("gatepost", "yourself") are no tag's signature, so no request
    is banned from them; a whole reply that says another tag's phrase (a gruff line for any
    archetype saying the sailor's "Fair winds") takes that phrase from the other tag."""
    plain = load_line_book(write(tmp_path, book_text(OWN_REPLIES, TRAIT_REPLIES))).signatures()
    assert not {"gatepost", "evening", "yourself"} & {p for phrases in plain.values() for p in phrases}
    assert "hmph" in plain["persona:gruff"] and "citizen" in plain["archetype:guard"]
    assert {"fair", "winds"} <= set(plain["archetype:sailor"])
    text = book_text(OWN_REPLIES, TRAIT_REPLIES.replace("Hmph. Hello yourself, [address].",
                                                        "Hmph. Fair winds to you too, [address]."))
    sig = load_line_book(write(tmp_path, text)).signatures()
    assert not {"fair", "winds", "fair winds"} & set(sig["archetype:sailor"])


def test_a_part_group_inside_a_reply_is_refused(tmp_path: Path) -> None:
    err = error_for(tmp_path, MINI.replace('greet: ["Hello, {player}."]', 'greet: ["Hello, {player}. [own_reply]"]'))
    assert err.field == "replies.idle.greet[0]" and "[own_reply] may only be used in compose patterns" in err.problem


def test_lint_lists_a_whole_reply_too_long_to_be_drawn_alone(tmp_path: Path) -> None:
    long = ("Evening watch is dull, [address], and the hours drag past the gate, the wall, the tower, "
            "the lane, the well and the old mill by the ford.")
    text = book_text(OWN_REPLIES).replace("Evening watch is dull, [address], but hello to you.", long)
    book = load_line_book(write(tmp_path, text))
    problems = [p for p in book.lint() if "never drawn alone" in p.problem]
    assert problems and all(p.sources == (f"{tmp_path / 'book.yaml'}:{line_of(text, 'old mill')}",) for p in problems)
    assert not any("old mill" in e.text for e in book.examples())
    assert not [p for p in load_line_book(write(tmp_path, book_text(OWN_REPLIES))).lint() if "never drawn" in p.problem]


def test_max_sentences_keeps_a_patterns_lines_to_that_many_sentences(tmp_path: Path) -> None:
    ctx = PATTERNS + '  - pattern: "[own_reply] [ctx]"\n    weight: 50\n    max_sentences: 2\n'
    two = OWN_REPLIES.replace('        - {text: "Gatepost', '        - "Hello again. Dull watch."\n        - {text: "Gatepost')
    text = MINI.replace("compose:\n", two + "compose:\n" + ctx)
    examples = load_line_book(write(tmp_path, text)).examples()
    composed = [e.text for e in examples if e.text.endswith("It is raining.")]
    # a one-sentence reply takes the rain remark; "Hello again. Dull watch." (two) does not
    assert {"Gatepost and me, we bid you good day. It is raining.",
            "Evening watch is dull, citizen, but hello to you. It is raining."} <= set(composed)
    assert not any("Dull watch. It is raining." in t for t in composed)
    unbounded = load_line_book(write(tmp_path, text.replace("    max_sentences: 2\n", ""))).examples()
    assert any(e.text.endswith("Dull watch. It is raining.") for e in unbounded)
    with pytest.raises(LineBookError) as info:
        load_line_book(write(tmp_path, text.replace("max_sentences: 2", "max_sentences: 0")))
    assert info.value.field.endswith(".max_sentences") and "outside [1, 100]" in info.value.problem
