"""The line book format: expansion semantics and errors naming file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.factory.linebook import LineBookError, load_line_book

MINI = """\
slots: [player, location]
banned_words: [okay, phone]
persona_traits:
  gruff:
    calm: ["Hmph."]
  kind:
    excludes: [gruff]
    calm: ["Bless you."]
states:
  idle:
    tone: calm
    leads: ["(Nothing|Little) doing, [address]."]
    codas: ["So (dull|slow)."]
  alert:
    tone: urgent
    leads: ["Halt, [address]!"]
intents:
  greet:
    slots: [player]
  ask_directions:
    slots: [player, location]
context:
  weather:
    rain:
      calm: ["It is raining."]
    clear:
archetypes:
  guard:
    voice:
      address: ["citizen", "stranger"]
  sailor:
    voice:
      address: ["matey"]
    tags:
      calm: ["Fair winds."]
replies:
  idle:
    greet: ["Hello, {player}."]
    ask_directions: ["{location} is (east|west)."]
  alert:
    greet: ["Who are you, {player}?"]
    ask_directions: ["Why {location}?"]
compose:
  - pattern: "[lead] [reply]"
    weight: 2
  - pattern: "[mood] [lead] [reply] [ctx]"
  - pattern: "[lead] [coda] [tag]"
    tones: [calm]
fallbacks:
  idle: ["Bored, [address]."]
  alert: ["Halt!"]
heldout_pairs:
  - [sailor, alert]
expansion:
  per_condition: 12
  max_words: 20
  min_words: 2
"""


def write(tmp_path: Path, text: str, name: str = "book.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_for(tmp_path: Path, text: str) -> LineBookError:
    path = write(tmp_path, text)
    with pytest.raises(LineBookError) as info:
        load_line_book(path)
    assert info.value.file == str(path)
    return info.value


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_mini_book_expands_deterministically(tmp_path: Path) -> None:
    path = write(tmp_path, MINI)
    first = load_line_book(path).examples()
    second = load_line_book(path).examples()
    assert first == second
    assert {e.archetype for e in first} == {"guard", "sailor"}
    texts = {e.text for e in first}
    assert any(t.startswith(("Nothing doing, citizen.", "Little doing, citizen.")) for t in texts)
    # a line names the player once: "[address]" and "{player}" never both
    assert not any("citizen" in t and "{player}" in t for t in texts)


def test_expansion_picks_fragments_from_the_drawn_persona_and_context(tmp_path: Path) -> None:
    examples = load_line_book(write(tmp_path, MINI)).examples()
    for e in examples:
        if "raining" in e.text:
            assert dict(e.context)["weather"] == "rain"
        if "Hmph." in e.text:
            assert "gruff" in e.persona
        if "Bless you." in e.text:
            assert "kind" in e.persona
        assert e.persona != ("gruff", "kind")  # kind excludes gruff
        if e.state == "alert":
            assert "raining" not in e.text  # rain has no urgent fragment
            assert "Fair winds." not in e.text  # the tag pattern is calm-only


def test_voice_group_is_one_choice_per_line(tmp_path: Path) -> None:
    text = MINI.replace('"[lead] [coda] [tag]"', '"[lead] [coda] [tag] [address]!"')
    for e in load_line_book(write(tmp_path, text)).examples():
        if (
            e.archetype == "guard"
            and "[" not in e.text
            and e.text.endswith("!")
            and e.state == "idle"
        ):
            assert not ("citizen" in e.text and "stranger" in e.text), e.text


def test_directory_books_merge_sections_across_files(tmp_path: Path) -> None:
    head, tail = MINI.split("replies:\n")
    write(tmp_path, head, "a.yaml")
    write(tmp_path, "replies:\n" + tail, "b.yaml")
    assert (
        load_line_book(tmp_path).examples()
        == load_line_book(write(tmp_path / "..", MINI, "one.yaml")).examples()
    )


def test_fallbacks_use_the_archetype_voice(tmp_path: Path) -> None:
    fallbacks = load_line_book(write(tmp_path, MINI)).fallback_lines()
    assert fallbacks[("guard", "idle")] == ["Bored, citizen.", "Bored, stranger."]
    assert fallbacks[("sailor", "alert")] == ["Halt!"]


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    text = MINI.replace('    leads: ["Halt, [address]!"]', '    leads: ["Halt, [address]!"')
    err = error_for(tmp_path, text)
    assert err.field == "<yaml>"
    assert err.line >= line_of(text, '"Halt, [address]!"')
    assert str(err).startswith(f"{err.file}:{err.line}: <yaml>: ")


def test_banned_word_is_rejected_at_its_line(tmp_path: Path) -> None:
    text = MINI.replace('greet: ["Hello, {player}."]', 'greet: ["Okay, {player}."]')
    err = error_for(tmp_path, text)
    assert err.line == line_of(text, "Okay, {player}")
    assert err.field == "replies.idle.greet[0]"
    assert "banned word 'okay'" in str(err)


def test_unknown_group_lists_known_groups(tmp_path: Path) -> None:
    text = MINI.replace('codas: ["So (dull|slow)."]', 'codas: ["So [adress]."]')
    err = error_for(tmp_path, text)
    assert err.line == line_of(text, "[adress]")
    assert err.field == "states.idle.codas[0]"
    assert "unknown group '[adress]'; known: [address]" in str(err)


def test_slot_not_allowed_for_the_intent(tmp_path: Path) -> None:
    text = MINI.replace(
        'greet: ["Hello, {player}."]', 'greet: ["Hello, {player}, go to {location}."]'
    )
    err = error_for(tmp_path, text)
    assert err.field == "replies.idle.greet[0]"
    assert "slot {location} is not allowed here" in str(err)


def test_unknown_slot_marker(tmp_path: Path) -> None:
    text = MINI.replace('greet: ["Who are you, {player}?"]', 'greet: ["Who are you, {name}?"]')
    err = error_for(tmp_path, text)
    assert err.line == line_of(text, "{name}")
    assert "unknown slot {name}" in str(err)


def test_unbalanced_alternatives(tmp_path: Path) -> None:
    text = MINI.replace('"{location} is (east|west)."', '"{location} is (east|west."')
    err = error_for(tmp_path, text)
    assert err.field == "replies.idle.ask_directions[0]"
    assert "unclosed '('" in str(err)


def test_unknown_state_in_replies_lists_closest_first(tmp_path: Path) -> None:
    text = MINI.replace("  alert:\n    greet:", "  alret:\n    greet:")
    err = error_for(tmp_path, text)
    assert err.line == line_of(text, "alret:")
    assert "unknown state 'alret'; known: alert, idle" in str(err)


def test_duplicate_key_is_reported(tmp_path: Path) -> None:
    text = MINI.replace("  sailor:\n    voice:", "  guard:\n    voice:")
    err = error_for(tmp_path, text)
    assert err.field == "archetypes.guard"
    second = [i for i, line in enumerate(text.splitlines(), 1) if line == "  guard:"][1]
    assert err.line == second
    assert "duplicate key" in str(err)


def test_missing_voice_group_names_the_archetype(tmp_path: Path) -> None:
    text = MINI.replace('      address: ["matey"]', '      greeting: ["ahoy"]')
    err = error_for(tmp_path, text)
    assert err.field == "archetypes.sailor"
    assert "voice group 'address'" in str(err)


def test_missing_replies_for_a_condition(tmp_path: Path) -> None:
    text = MINI.replace('    ask_directions: ["Why {location}?"]\n', "")
    err = error_for(tmp_path, text)
    assert err.field == "replies.alert.ask_directions"


def test_wrong_type_is_reported_with_field(tmp_path: Path) -> None:
    text = MINI.replace("  per_condition: 12", "  per_condition: many")
    err = error_for(tmp_path, text)
    assert err.field == "expansion.per_condition"
    assert err.line == line_of(text, "per_condition: many")
    assert "expected an integer" in str(err)


def test_unknown_section(tmp_path: Path) -> None:
    err = error_for(tmp_path, MINI + "lines: []\n")
    assert err.field == "lines"
    assert "unknown section" in str(err)


def test_same_text_for_two_states_is_an_error(tmp_path: Path) -> None:
    text = MINI.replace('leads: ["Halt, [address]!"]', 'leads: ["Nothing doing, [address]."]')
    text = text.replace('greet: ["Who are you, {player}?"]', 'greet: ["Hello there."]')
    text = text.replace('greet: ["Hello, {player}."]', 'greet: ["Hello there."]')
    text = text.replace("tone: urgent", "tone: calm")
    book = load_line_book(write(tmp_path, text))  # loads: the clash only shows on expansion
    with pytest.raises(LineBookError) as info:
        book.examples()
    err = info.value
    assert err.field.startswith("compose[")
    assert "every line must belong to one state" in str(err)


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(LineBookError, match="no such file or directory"):
        load_line_book(tmp_path / "nope.yaml")


OWN = MINI.replace("compose:\n", """own_lines:
  guard:
    idle: ["Gate's shut, [address], and I lean on it."]
    alert: ["Who's at the gate?"]
  sailor:
    idle: ["Nets mended, ropes coiled."]
compose:
  - pattern: "[own] [reply]"
    weight: 50
""")


def test_own_lines_speak_in_their_archetype_and_state_only(tmp_path: Path) -> None:
    examples = load_line_book(write(tmp_path, OWN)).examples()
    for e in examples:
        if "Gate's shut" in e.text:
            assert (e.archetype, e.state) == ("guard", "idle")
            assert "matey" not in e.text and "{player}" not in e.text  # one address per line
        if "Nets mended" in e.text:
            assert (e.archetype, e.state) == ("sailor", "idle")
    assert any("Gate's shut" in e.text for e in examples)
    # sailor has no alert own line: the [own] pattern is never drawn for it
    assert not any(e.text.startswith("Who's at the gate?") for e in examples if e.archetype == "sailor")


@pytest.mark.parametrize(("patch", "field", "problem"), [
    ('  sailor:\n    idle: ["Nets mended, ropes coiled."]', "own_lines.sailor.rest",
     "unknown state 'rest'"),
    ('  sailor:\n    idle: ["Nets mended, ropes coiled."]', "own_lines.sailor.idle[0]",
     "archetype's voice groups"),
])
def test_own_line_errors_name_file_line_and_field(tmp_path: Path, patch: str, field: str,
                                                   problem: str) -> None:
    bad = ('  sailor:\n    rest: ["Nets."]' if "rest" in field
           else '  sailor:\n    idle: ["Nets [way]."]')
    with pytest.raises(LineBookError) as info:
        load_line_book(write(tmp_path, OWN.replace(patch, bad)))
    assert info.value.field == field and problem in info.value.problem
    assert info.value.line > 1


def test_a_context_word_outside_its_value_is_an_error_naming_the_fragment(tmp_path: Path) -> None:
    text = MINI.replace('rain:\n      calm: ["It is raining."]',
                        'rain:\n      implies: [raining, wet]\n      calm: ["It is raining."]')
    load_line_book(write(tmp_path, text))  # the value's own fragment may say it
    leak = text.replace('codas: ["So (dull|slow)."]', 'codas: ["So (dull|wet)."]')
    with pytest.raises(LineBookError) as info:
        load_line_book(write(tmp_path, leak))
    assert info.value.field == "states.idle.codas[0]"
    assert "asserts weather=rain" in info.value.problem


def test_every_prompt_shape_is_expanded_and_omitted_slots_are_never_voiced(tmp_path: Path) -> None:
    examples = load_line_book(write(tmp_path, MINI)).examples()
    assert {len(e.persona) for e in examples} == {0, 1}  # kind excludes gruff: no pair
    assert {len(e.context) for e in examples} == {0, 1}
    for e in examples:
        if "Hmph." in e.text:
            assert "gruff" in e.persona
        if "raining" in e.text:
            assert dict(e.context).get("weather") == "rain"


def test_vocabulary_and_signatures_come_from_what_the_book_says(tmp_path: Path) -> None:
    book = load_line_book(write(tmp_path, MINI))
    vocab = book.vocabulary()
    assert vocab == sorted(vocab) and {"halt", "citizen", "matey", "raining"} <= set(vocab)
    assert "okay" not in vocab
    sig = book.signatures()
    assert "citizen" in sig["archetype:guard"] and "matey" in sig["archetype:sailor"]
    assert "hmph" in sig["persona:gruff"]
    assert "raining" in sig["context:weather=rain"]
    assert sig["context:weather=clear"] == []
    # words every tag shares are nobody's signature
    assert not any("halt" in p.split() for ps in sig.values() for p in ps)


def test_lint_names_the_fragments_of_a_dropped_artifact(tmp_path: Path) -> None:
    text = MINI.replace('codas: ["So (dull|slow)."]', 'codas: ["So so dull."]')
    book = load_line_book(write(tmp_path, text))
    problems = [p for p in book.lint() if p.problem == "double word"]
    assert problems
    coda = f":{line_of(text, 'So so dull.')}"
    assert all(any(s.endswith(coda) for s in p.sources) for p in problems)
    assert not any("So so" in e.text for e in book.examples())


def test_slot_defaults_name_known_slots_and_plain_text(tmp_path: Path) -> None:
    ok = load_line_book(write(tmp_path, MINI + "slot_defaults:\n  player: friend\n"))
    assert ok.slot_defaults == {"player": "friend"}
    err = error_for(tmp_path, MINI + "slot_defaults:\n  item: that\n")
    assert err.field == "slot_defaults.item" and "unknown slot 'item'" in err.problem
    err = error_for(tmp_path, MINI + "slot_defaults:\n  player: '[address]'\n")
    assert err.field == "slot_defaults.player" and "plain text" in err.problem


@pytest.mark.parametrize("glued", ["{player}'s", "{player}'ll", "{player}\u2019s"])
def test_a_possessive_or_contraction_glued_to_a_slot_is_refused_at_its_line(tmp_path: Path, glued: str) -> None:
    """The game fills a slot with its own text ("the fields", "Silas"): "{location}'s way" would
    read "the fields's way", so the book refuses it where it is written."""
    text = MINI.replace('greet: ["Hello, {player}."]', f'greet: ["Hello, {glued} friend."]')
    err = error_for(tmp_path, text)
    assert err.line == line_of(text, glued) and "glued to a slot" in err.problem
    assert load_line_book(write(tmp_path, MINI.replace('"Hello, {player}."', '"Hello, {player}, my friend."')))


def test_a_fragment_that_glues_an_apostrophe_to_a_slot_is_dropped_as_an_artifact(tmp_path: Path) -> None:
    """A slot followed by a group whose fragment starts with "'s" is only glued once expanded:
    the lint drops those lines and names the fragments."""
    text = MINI.replace('greet: ["Hello, {player}."]', 'greet: ["Hello, {player}[poss]."]').replace(
        "replies:", "phrases:\n  poss: [\"'s friend\", \", my friend\"]\nreplies:", 1)
    book = load_line_book(write(tmp_path, text))
    assert any(p.problem == "slot possessive" for p in book.lint())
    assert not any("}'" in e.text for e in book.examples())
