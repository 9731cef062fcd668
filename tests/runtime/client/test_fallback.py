"""FallbackBook: authored lines that answer the player's move from the NPC's archetype and state,
in a documented order when a cell is empty, never twice in a row per NPC; both file versions."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from runtime.client.fallback import ANY_INTENT, FORMAT_VERSION, GENERIC, FallbackBook
from runtime.factory.linebook import LineBook, load_line_book
from runtime.paths import DEFAULT_MODEL_DIR


@pytest.fixture(scope="module")
def line_book() -> LineBook:
    return load_line_book()


@pytest.fixture(scope="module")
def cells(line_book: LineBook) -> dict[tuple[str, str, str], list[str]]:
    return line_book.fallback_cells()


@pytest.fixture(scope="module")
def book(cells) -> FallbackBook:
    return FallbackBook(cells)


def test_the_shipped_fallbacks_are_the_line_books_cells_in_version_3(book):
    shipped = FallbackBook.shipped()
    assert shipped.lines == book.lines
    doc = json.loads((DEFAULT_MODEL_DIR / "fallbacks.json").read_text())
    assert doc["version"] == FORMAT_VERSION == 3 and set(doc) == {"version", "strings", "lines"}
    assert len(doc["strings"]) == len(set(doc["strings"]))  # every line once


def test_the_default_book_writes_a_cell_for_every_archetype_state_and_intent(line_book, cells):
    want = {(a, s, i) for a in line_book.archetypes for s in line_book.states
            for i in (ANY_INTENT, *line_book.intents)}
    assert set(cells) == want
    assert all(cells.values())
    assert not [p for p in line_book.lint() if p.text.startswith("fallbacks.") or "fallback" in p.problem]


def test_for_every_state_and_intent_the_picked_line_is_from_that_intents_cell(line_book, cells, book):
    rng = np.random.default_rng(0)
    for (arch, state, intent), lines in cells.items():
        for _ in range(3):  # the same NPC thrice: the no-repeat rule stays inside the cell
            assert book.pick(arch, state, (arch, state, intent), rng, intent=intent) in lines


def test_a_fallback_answers_the_move_not_only_the_state(book, line_book):
    """The defect this table fixes: "Halt! Who goes there?" to a farewell, a greeting to a
    rumour question. Each intent's lines are its own: no alert farewell challenges the player."""
    rng = np.random.default_rng(3)
    farewells = {book.pick("guard", "alert", i, rng, intent="farewell") for i in range(40)}
    assert "Halt! Who goes there?" not in farewells and farewells <= set(book.candidates("guard", "alert", "farewell"))
    rumours = {book.pick("sailor", "friendly", i, rng, intent="ask_rumors") for i in range(40)}
    assert not any("Well met" in t for t in rumours)
    for arch in line_book.archetypes:
        for state in line_book.states:
            by_intent = [set(book.candidates(arch, state, i)) for i in line_book.intents]
            assert len({frozenset(s) for s in by_intent}) == len(line_book.intents), (arch, state)


def test_an_archetypes_own_lines_for_a_move_come_before_the_states(cells):
    assert cells[("child", "combat", "threaten")][0] == "I'll bonk you with my stick!"
    assert cells[("child", "combat", ANY_INTENT)][0] == "Take that! And that!"
    # the child's other combat moves are the state's lines in the child's voice
    assert any("mister" in t for t in cells[("child", "combat", "approach")])


def test_without_an_intent_the_states_any_lines_answer(book, cells):
    rng = np.random.default_rng(5)
    for _ in range(20):
        assert book.pick("guard", "alert", "npc", rng) in cells[("guard", "alert", ANY_INTENT)]


def test_an_empty_cell_falls_back_to_a_near_states_move_then_the_any_cell_then_generic_lines():
    book = FallbackBook({("guard", "alert", "greet"): ["Who are you?"], ("guard", "alert"): ["Keep back!"],
                         ("guard", "idle", "farewell"): ["Bye."]})
    assert book.candidates("guard", "alert", "greet") == ("Who are you?",)
    assert book.candidates("guard", "alert", "farewell") == ("Keep back!",)  # no farewell cell in alert's temper
    assert book.candidates("guard", "alert") == ("Keep back!",)
    assert book.candidates("guard", "idle", "greet") == GENERIC  # alert is of the other temper
    assert book.candidates("guard", "flee", "greet") == GENERIC  # combat is flee's only near state
    book = book.replaced({("guard", "combat", "greet"): ["Behind me!"]})
    assert book.candidates("guard", "flee", "greet") == ("Behind me!",)
    assert book.candidates("guard", "rest", "farewell") == ("Bye.",)  # idle is rest's nearest
    assert book.candidates("guard", "combat", "farewell") == GENERIC
    assert book.candidates("ghost", "alert", "greet") == GENERIC  # never another archetype's


def test_the_same_npc_never_gets_the_same_fallback_twice_in_a_row(book):
    rng = np.random.default_rng(1)
    for npc in range(5):
        said = [book.pick("guard", "alert", npc, rng, intent="threaten") for _ in range(50)]
        assert all(a != b for a, b in itertools.pairwise(said))
        assert len(set(said)) > 1


def test_a_seeded_pick_is_the_same_in_every_fresh_book(cells):
    def run() -> list[str]:
        book = FallbackBook(cells)
        return [book.pick("farmer", s, s, np.random.default_rng([k, 7919]), intent=i)
                for k, (s, i) in enumerate(itertools.product(("rest", "flee"), ("greet", "trade", None)))]
    assert run() == run()


def test_a_version_1_file_loads_as_the_any_cells(tmp_path):
    path = tmp_path / "fallbacks.json"
    path.write_text(json.dumps({"guard": {"alert": ["Halt!", "Stop!"]}, "smuggler": {"idle": ["Psst."]}}))
    book = FallbackBook.from_json(path)
    assert book.lines == {("guard", "alert", ANY_INTENT): ("Halt!", "Stop!"),
                          ("smuggler", "idle", ANY_INTENT): ("Psst.",)}
    assert book.candidates("guard", "alert", "farewell") == ("Halt!", "Stop!")


def test_the_version_3_document_round_trips_and_version_2_reads_the_same(book, tmp_path):
    path = tmp_path / "fallbacks.json"
    doc = book.to_doc()
    path.write_text(json.dumps(doc))
    again = FallbackBook.from_json(path)
    assert again.lines == book.lines
    assert next(iter(doc["lines"]["guard"]["alert"])) == ANY_INTENT
    v2 = {"version": 2, "lines": {a: {s: {i: [doc["strings"][k] for k in refs] for i, refs in cells.items()}
                                      for s, cells in states.items()} for a, states in doc["lines"].items()}}
    assert FallbackBook.from_doc(v2).lines == book.lines
    assert len(json.dumps(doc, separators=(",", ":"))) < 0.6 * len(json.dumps(v2, separators=(",", ":")))


def test_a_studio_pair_replaces_every_cell_of_its_archetype_and_state():
    base = FallbackBook({("guard", "alert", "farewell"): ["Go."], ("guard", "alert"): ["Halt!"],
                         ("guard", "idle"): ["Hm, quiet."]})
    out = base.replaced({("guard", "alert"): ["Psst."], ("smuggler", "idle", "greet"): ["Ahoy."]})
    assert out.candidates("guard", "alert", "farewell") == ("Psst.",)
    assert out.candidates("guard", "idle") == ("Hm, quiet.",)
    assert out.candidates("smuggler", "idle", "greet") == ("Ahoy.",)
    assert base.candidates("guard", "alert", "farewell") == ("Go.",)  # the base is unchanged


@pytest.mark.parametrize(("text", "message"), [
    ("{", r"fallbacks\.json: cannot read"),
    ("[1, 2]", r"fallbacks\.json: expected an object"),
    ('{"guard": {"alert": "Halt!"}}', r"fallbacks\.json: guard\.alert must be a list of strings"),
    ('{"guard": ["Halt!"]}', r"fallbacks\.json: 'guard' must map states"),
    ('{"version": 4, "lines": {}}', r"fallbacks\.json: version: 4 is not a fallbacks\.json version"),
    ('{"version": 3, "lines": {}}', r"fallbacks\.json: strings must be a list of strings"),
    ('{"version": 3, "strings": ["x"], "lines": {"guard": {"alert": {"any": ["x"]}}}}',
     r"fallbacks\.json: lines\.guard\.alert\.any must be a list of indexes into strings"),
    ('{"version": 3, "strings": ["x"], "lines": {"guard": {"alert": {"any": [0, 1]}}}}',
     r"fallbacks\.json: lines\.guard\.alert\.any: index 1 is outside strings \(0\.\.0\)"),
    ('{"version": 2, "strings": [], "lines": {}}', r"fallbacks\.json: strings: unknown key"),
    ('{"version": 2}', r"fallbacks\.json: lines: expected an object"),
    ('{"version": 2, "lines": {}, "cells": 1}', r"fallbacks\.json: cells: unknown key"),
    ('{"version": 2, "lines": {"guard": ["x"]}}', r"fallbacks\.json: lines\.guard must map states"),
    ('{"version": 2, "lines": {"guard": {"alert": ["x"]}}}', r"fallbacks\.json: lines\.guard\.alert must map intents"),
    ('{"version": 2, "lines": {"guard": {"alert": {"greet": [1]}}}}',
     r"fallbacks\.json: lines\.guard\.alert\.greet must be a list of strings"),
])
def test_a_bad_file_gives_an_error_naming_the_file_and_the_key(tmp_path: Path, text: str, message: str):
    path = tmp_path / "fallbacks.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as info:
        FallbackBook.from_json(path)
    assert str(info.value).startswith(str(path))
