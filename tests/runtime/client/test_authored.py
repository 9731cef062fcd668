"""A studio's authored lines: which a request may get (Valve-style criteria), most specific first,
the rule pick FlashNPC is measured against, and the file format's errors."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from runtime.client.authored import AuthoredBook, AuthoredLine
from runtime.client.fallback import GENERIC, FallbackBook

AL = AuthoredLine
BOOK = AuthoredBook([
    AL("dockmaster", "working", "greet", "Bay four. Make it quick."),
    AL("dockmaster", "working", "greet", "Red lights, {player}. Inside, now.", context=(("alarm", "red"),)),
    AL("dockmaster", "working", "greet", "Another form. Wonderful.", persona=("weary",)),
    AL("dockmaster", "working", "trade", "Docking fees are posted. Read them."),
    AL("dockmaster", "patrol", "farewell", "Mind the yellow line."),
    AL("medic", "working", "greet", "Sit. Don't bleed on the chair."),
])


def test_a_request_gets_only_lines_whose_every_criterion_holds():
    groups = BOOK.playable("dockmaster", "working", "greet")
    assert [[ln.text for ln in g] for g in groups] == [["Bay four. Make it quick."]]
    # the alarm line needs alarm=red and a {player}; the weary line needs the trait
    groups = BOOK.playable("dockmaster", "working", "greet", ["weary"], {"alarm": "red"}, slots=["player"])
    assert [len(g) for g in groups] == [2, 1]  # both tagged lines before the untagged one
    assert {ln.text for ln in groups[0]} == {"Red lights, {player}. Inside, now.", "Another form. Wonderful."}
    assert BOOK.playable("dockmaster", "working", "greet", context={"alarm": "green"})[0][0].text == \
        "Bay four. Make it quick."
    assert not BOOK.covers("dockmaster", "working", "farewell")
    assert not BOOK.covers("guard", "working", "greet")


def test_the_rule_pick_is_the_archetypes_best_tag_match_and_never_contradicts_the_request():
    rng = np.random.default_rng(0)
    pick = BOOK.rule_pick("dockmaster", "working", "farewell", rng=rng)
    assert pick is not None and pick.text in {"Bay four. Make it quick.", "Docking fees are posted. Read them.",
                                              "Mind the yellow line."}  # one point each: state, or intent
    pick = BOOK.rule_pick("dockmaster", "working", "greet", context={"alarm": "red"}, rng=rng, slots=["player"])
    assert pick is not None and pick.text == "Red lights, {player}. Inside, now."
    for _ in range(20):
        pick = BOOK.rule_pick("dockmaster", "working", "greet", context={"alarm": "green"}, rng=rng)
        assert pick is not None and "Red lights" not in pick.text and "form" not in pick.text
    assert BOOK.rule_pick("guard", "working", "greet", rng=rng) is None


def test_the_file_round_trips_and_a_bad_one_is_named(tmp_path):
    path = tmp_path / "authored.json"
    path.write_text(json.dumps(BOOK.to_doc()))
    assert AuthoredBook.from_json(path).lines == BOOK.lines
    cases = [({"version": 2, "lines": []}, "expected"),
             ({"version": 1, "lines": {}}, "lines: expected a list"),
             ({"version": 1, "lines": [], "extra": 1}, "extra: unknown key"),
             ({"version": 1, "lines": [{"archetype": "a", "state": "b", "intent": "c"}]}, r"lines\[0\]: text"),
             ({"version": 1, "lines": [{"archetype": "a", "state": "b", "intent": "c", "text": "x",
                                        "persona": "weary"}]}, r"lines\[0\]: persona"),
             ({"version": 1, "lines": [{"archetype": "a", "state": "b", "intent": "c", "text": "x",
                                        "context": {"alarm": 1}}]}, r"lines\[0\]: context")]
    for doc, message in cases:
        path.write_text(json.dumps(doc))
        with pytest.raises(ValueError, match=message):
            AuthoredBook.from_json(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"authored\.json: cannot read"):
        AuthoredBook.from_json(path)


def test_a_fallback_answers_the_move_from_a_near_state_before_any_other_moves_line():
    book = FallbackBook({("smuggler", "combat", "greet"): ["You? Get down!"],
                         ("smuggler", "alert", "trade"): ["Not now."],
                         ("smuggler", "rest", "greet"): ["Mm? Oh, hello."],
                         ("smuggler", "alert", "any"): ["Quiet."]})
    # alert's own greet cell is empty: combat (its near state) answers, not the alert trade line
    assert book.candidates("smuggler", "alert", "greet") == ("You? Get down!",)
    # flee has no greet cell and its near state none: rest is of the other temper
    assert book.candidates("smuggler", "flee", "farewell") == GENERIC
    assert book.candidates("smuggler", "alert", "farewell") == ("Quiet.",)
    assert book.candidates("smuggler", "alert", None) == ("Quiet.",)


def test_a_writers_line_is_judged_by_the_requests_banned_phrases_not_by_the_models_vocabulary():
    from runtime.client.constraints import read_constraints
    from runtime.paths import DEFAULT_MODEL_DIR
    from runtime.tokenizer import Tokenizer

    shipped = read_constraints(DEFAULT_MODEL_DIR)
    # a fine-tune's vocabulary holds the studio's words; the default book's whole lines never say
    # "daylight" (only its context remarks did), and a word outside the vocabulary is not judged
    added = [w for w in ("full", "daylight", "buyers") if w not in shipped.vocabulary]
    studio = dataclasses.replace(shipped, vocabulary=(*shipped.vocabulary, *added), bigrams=None, trigrams=None)
    words = studio.word_constraint(Tokenizer.load(DEFAULT_MODEL_DIR))
    night = words.banned_bits("merchant", context={"time_of_day": "night"})
    day = words.banned_bits("merchant", context={"time_of_day": "day"})
    assert words.says_banned("Full daylight, and no buyers.", night)  # night called daylight
    assert not words.says_banned("Full daylight, and no buyers.", day)
    assert not words.says_banned("Caf\u00e9 first, haggling after, {player}.", night)  # unknown words are the writer's


def test_near_state_lines_answer_the_move_and_the_best_fitting_ones_are_drawn():
    near = BOOK.near("dockmaster", "idle", "greet")  # idle's near states: friendly, rest, working, patrol
    assert [ln.text for ln in near] == ["Bay four. Make it quick."]
    assert BOOK.near("dockmaster", "idle", "farewell")[0].text == "Mind the yellow line."
    assert BOOK.near("dockmaster", "combat", "farewell") == []  # patrol is of the other temper
    lines = [AL("a", "idle", "greet", t) for t in ("One.", "Two.", "Three.")]
    rng = np.random.default_rng(0)
    drawn = {AuthoredBook.choose_fitting(lines, np.array([-0.1, -0.2, -1.0]), rng).text for _ in range(40)}
    assert drawn == {"One.", "Two."}  # within 0.15 nats of the best; never the poor fit


def test_a_near_state_line_that_says_a_word_marking_its_own_state_is_not_played_for_another():
    rest = [AL("nurse", "rest", "farewell", t) for t in
            ("Bye. I'm on break, so shoo.", "On break. Go away.", "Later. Still on break.")]
    idle = [AL("nurse", "idle", "greet", "Hi. Quiet night.")]
    book = AuthoredBook([*rest, AL("nurse", "friendly", "farewell", "Take care of that cough."), *idle])
    assert ("on", "break") in book.state_marks["rest"] and ("break",) in book.state_marks["rest"]
    # idle farewell: rest is a near state, but its lines say "on break"; friendly's line answers
    assert [ln.text for ln in book.near("nurse", "idle", "farewell")] == ["Take care of that cough."]
    assert book.playable("nurse", "rest", "farewell")  # a rest request still plays them


def test_near_state_lines_voicing_the_requests_persona_come_before_untagged_ones():
    book = AuthoredBook([AL("nurse", "rest", "greet", "Hi."),
                         AL("nurse", "friendly", "greet", "Oh! Hello... sorry, you startled me.", persona=("shy",))])
    assert [ln.text for ln in book.near("nurse", "idle", "greet", ["shy"])] == ["Oh! Hello... sorry, you startled me."]
    assert [ln.text for ln in book.near("nurse", "idle", "greet")] == ["Hi."]


def test_hostile_authored_files_raise_value_error_naming_the_file_or_load():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8)
    doc = st.recursive(leaf, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.sampled_from(["version", "lines", "archetype", "state", "intent",
                                                          "text", "persona", "context", "x"]), inner, max_size=6),
                       max_leaves=20)

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(doc)
    def check(d):
        try:
            book = AuthoredBook.from_doc(d, source="hostile.json")
        except ValueError as exc:
            assert str(exc).startswith("hostile.json")
        else:
            for line in book.lines:  # what loads is usable
                book.playable(line.archetype, line.state, line.intent, line.persona, dict(line.context),
                              line.slots)

    check()
