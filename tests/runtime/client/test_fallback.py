"""FallbackBook: authored lines that fit the archetype and state, never twice in a row per NPC."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from runtime.client.fallback import GENERIC, FallbackBook
from runtime.factory.linebook import load_line_book


@pytest.fixture(scope="module")
def book() -> FallbackBook:
    return FallbackBook(load_line_book().fallback_lines())


def test_the_shipped_fallbacks_are_the_line_books(book):
    assert FallbackBook.shipped().lines == book.lines


def test_lines_fit_the_archetype_and_state(book):
    expected = load_line_book().fallback_lines()
    rng = np.random.default_rng(0)
    for (arch, state), lines in expected.items():
        assert book.pick(arch, state, ("npc", arch, state), rng) in lines


def test_the_same_npc_never_gets_the_same_fallback_twice_in_a_row(book):
    rng = np.random.default_rng(1)
    for npc in range(5):
        said = [book.pick("guard", "alert", npc, rng) for _ in range(50)]
        assert all(a != b for a, b in itertools.pairwise(said))
        assert len(set(said)) > 1


def test_unknown_pairs_fall_back_to_the_archetype_then_to_generic_lines():
    book = FallbackBook({("guard", "alert"): ["Halt!"], ("guard", "idle"): ["Hm, quiet."]})
    rng = np.random.default_rng(0)
    assert book.pick("guard", "combat", 1, rng) in ("Halt!", "Hm, quiet.")
    assert book.pick("ghost", "idle", 2, rng) in GENERIC


def test_json_round_trip_and_errors_name_the_file(tmp_path):
    path = tmp_path / "fallbacks.json"
    path.write_text(json.dumps({"guard": {"alert": ["Halt!", "Stop!"]}}))
    assert FallbackBook.from_json(path).candidates("guard", "alert") == ("Halt!", "Stop!")
    path.write_text(json.dumps({"guard": {"alert": "Halt!"}}))
    with pytest.raises(ValueError, match=r"fallbacks\.json: guard\.alert must be a list"):
        FallbackBook.from_json(path)
    path.write_text("{")
    with pytest.raises(ValueError, match=r"fallbacks\.json: cannot read"):
        FallbackBook.from_json(path)
