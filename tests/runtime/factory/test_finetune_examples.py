"""The pirate-port example's data and rating sheet: the composed file is what ``make_lines.py``
writes and reads back through ``read_lines`` without a bad row, the rating sheet's design does
not tie the persona or the tide to one archetype, and the trigram diagnostic of a rated sheet."""

from __future__ import annotations

import csv
import importlib.util
import json
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "finetune"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"finetune_example_{name}", EXAMPLE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def composed(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, str]]:
    out = tmp_path_factory.mktemp("lines") / "more.csv"
    assert load("make_lines").main(["--out", str(out)]) == 0
    with out.open(newline="") as f:
        return list(csv.DictReader(f))


def test_the_composed_file_is_the_committed_one(composed):
    with (EXAMPLE / "pirate_port_more.csv").open(newline="") as f:
        assert list(csv.DictReader(f)) == composed


def test_the_composed_file_reads_without_a_bad_row(composed):
    from runtime.factory.finetune import read_lines

    catalog = json.loads((Path(__file__).resolve().parents[3] / "runtime" / "assets" / "flash" /
                          "catalog.json").read_text())
    lines = read_lines(EXAMPLE / "pirate_port_more.csv", catalog)
    assert len(lines) == len(composed)


def test_the_rating_sheet_spreads_persona_and_tide_over_every_archetype():
    demo = load("demo")
    prompts = demo.rating_prompts(72)
    per_arch = Counter(a for a, *_ in prompts)
    with_trait = Counter(a for a, _, _, persona, _ in prompts if persona)
    assert per_arch == {a: 24 for a in demo.NEW}
    assert with_trait == {a: 8 for a in demo.NEW}
    tides = {a: Counter(ctx.get("tide") for b, _, _, _, ctx in prompts if b == a) for a in demo.NEW}
    assert all(t == {"low": 8, "high": 8, None: 8} for t in tides.values())
    trait_tides = {a: {ctx.get("tide") for b, _, _, persona, ctx in prompts if b == a and persona} for a in demo.NEW}
    assert all(t == {"low", "high", None} for t in trait_tides.values())
    cells = Counter((a, s) for a, s, *_ in prompts)
    assert set(cells.values()) == {3} and len(cells) == 24
    assert len({i for _, _, i, _, _ in prompts}) == 7


def test_unseen_trigrams_flags_a_line_that_joins_two_known_pairs_into_a_new_phrase(tmp_path):
    demo = load("demo")
    (tmp_path / "studio_lines.jsonl").write_text("".join(json.dumps({"line": t}) + "\n" for t in (
        "Douse that lantern, {player}.", "Ask the watch. I'm busy looking for a thief.")))
    sheet = tmp_path / "sheet.csv"
    with sheet.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=demo.FIELDS)
        w.writeheader()
        for line, rating, fallback in (("Douse that lantern, Mara.", "2", "0"), ("Ask the lantern.", "0", "0"),
                                       ("Ask the thief.", "2", "0"), ("Ask the thief lantern.", "0", "1")):
            w.writerow({**dict.fromkeys(demo.FIELDS, ""), "line": line, "rating": rating, "fallback": fallback})
    out = demo.unseen_trigrams(sheet, tmp_path, book=frozenset({("ask", "the", "thief")}))
    assert out["2"] == {"lines": 2, "with_unseen_trigram": 0, "examples": []}  # a book phrase is known
    assert out["0"] == {"lines": 1, "with_unseen_trigram": 1, "examples": ["Ask the lantern."]}  # the fallback not counted
    assert out["1"]["lines"] == 0
