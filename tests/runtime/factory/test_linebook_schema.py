"""The line book's format table: a JSON Schema every shipped book file meets, that names a
misspelt field where a writer's editor shows it, and that knows every section the reader reads."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from plugin.cli import main
from runtime.factory.linebook import DEFAULT_PATH
from runtime.factory.linebook.reader import _LIST_SECTIONS, _MAP_SECTIONS
from runtime.factory.linebook.schema import SECTIONS, json_schema

VALIDATOR = jsonschema.Draft202012Validator(json_schema())


def test_the_schema_is_valid_and_every_shipped_book_file_meets_it():
    jsonschema.Draft202012Validator.check_schema(json_schema())
    files = [*sorted(Path(DEFAULT_PATH).glob("*.yaml")), Path(DEFAULT_PATH).parent / "compose_v4.yaml"]
    assert len(files) > 10
    for file in files:
        errors = [f"{list(e.absolute_path)}: {e.message[:80]}" for e in VALIDATOR.iter_errors(yaml.safe_load(file.read_text()))]
        assert not errors, (file.name, errors[:3])


def test_the_table_has_every_section_the_reader_reads():
    assert set(SECTIONS) == set(_MAP_SECTIONS) | set(_LIST_SECTIONS)


@pytest.mark.parametrize(("doc", "path"), [
    ({"archetypes": {"guard": {"voise": {"address": ["citizen"]}}}}, ["archetypes", "guard"]),
    ({"states": {"alert": {"tone": "loud", "leads": ["Halt!"]}}}, ["states", "alert", "tone"]),
    ({"persona_traits": {"gruff": {"calm": [{"text": "Hmph.", "at": "middle"}]}}}, ["persona_traits", "gruff", "calm", 0]),
    ({"compose": [{"weight": 2}]}, ["compose", 0]),
    ({"replys": {}}, []),
    ({"heldout_pairs": [["sailor"]]}, ["heldout_pairs", 0]),
])
def test_a_writers_slip_is_flagged_where_it_is(doc, path):
    errors = list(VALIDATOR.iter_errors(doc))
    assert errors and any(list(e.absolute_path)[:len(path)] == path for e in errors), [
        (list(e.absolute_path), e.message) for e in errors]


def test_flashnpc_linebook_prints_the_schema_and_lints_a_book(tmp_path, capsys):
    assert main(["linebook", "schema"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "FlashNPC line book file"
    assert main(["linebook", "schema", "--out", str(tmp_path / "s.json")]) == 0
    assert json.loads((tmp_path / "s.json").read_text()) == json_schema()
    capsys.readouterr()
    bad = tmp_path / "bad.yaml"
    bad.write_text("slots: [player]\narchetypes:\n  guard:\n    voise: {}\n")
    assert main(["linebook", "lint", str(bad)]) == 1
    assert "bad.yaml" in capsys.readouterr().err
    assert main(["linebook"]) == 2
