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



def _eval_report(seed: int, fidelity_heldout: float, cells: dict[str, tuple[int, float]],
                 fast: bool = True) -> dict[str, object]:
    """A minimal ``flashnpc eval --json`` report: one side per shape, ``cells`` shape -> (lines,
    archetype_accuracy)."""
    return {"config": {"seed": seed, "writer_samples": 70 if fast else 300},
            "figures": {"fidelity_seen": 1.0, "fidelity_heldout": fidelity_heldout, "distinct2": 0.4, "novelty": 0.9},
            "writer": {"thresholds": {"archetype_accuracy": {"min": 0.3}},
                       "cells": {shape: {"seen": {"lines": n, "model": {"archetype_accuracy": acc}}}
                                 for shape, (n, acc) in cells.items()}}}


def test_compare_eval_pools_seeds_by_lines_and_reports_the_base_seed_spread():
    compare = load("compare_eval").compare
    base = [_eval_report(0, 0.98, {"full": (70, 0.30), "ctx0": (30, 0.20)}),
            _eval_report(1, 0.96, {"full": (70, 0.26), "ctx0": (30, 0.30)})]
    tuned = [_eval_report(0, 0.96, {"full": (70, 0.25), "ctx0": (30, 0.25)})]
    rows = {r["measure"]: r for r in compare(base, tuned)}
    arch = rows["writer archetype_accuracy"]
    # pooled over both seeds, lines-weighted: (70 * .30 + 30 * .20 + 70 * .26 + 30 * .30) / 200
    assert arch["base"] == pytest.approx(27.1) and arch["tuned"] == pytest.approx(25.0)
    assert arch["delta"] == pytest.approx(-2.1) and arch["regressed"]
    assert arch["spread"] == pytest.approx(0.2)  # seed 0 pools to 27.0, seed 1 to 27.2
    held = rows["fidelity_heldout"]  # the eval's headline figure: the mean over the seeds
    assert held["base"] == pytest.approx(97.0) and held["spread"] == pytest.approx(2.0)
    assert held["delta"] == pytest.approx(-1.0) and not held["regressed"]


def test_compare_eval_of_one_report_each_has_no_spread():
    compare = load("compare_eval").compare
    rows = compare(_eval_report(0, 0.98, {"full": (70, 0.30)}), _eval_report(0, 0.98, {"full": (70, 0.30)}))
    assert rows and all(r["spread"] is None and r["delta"] == 0 and not r["regressed"] for r in rows)


def test_compare_eval_refuses_to_pool_evals_run_with_different_flags(tmp_path):
    module = load("compare_eval")
    fast, full = _eval_report(0, 0.98, {"full": (70, 0.3)}), _eval_report(1, 0.98, {"full": (70, 0.3)}, fast=False)
    with pytest.raises(ValueError, match="different flags"):
        module.compare([fast, full], [fast])
    paths = []
    for name, report in (("a", fast), ("b", fast), ("c", full)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(report))
    with pytest.raises(SystemExit, match="different flags"):
        module.main([str(paths[0]), str(paths[1]), "--also-tuned", str(paths[2])])
    (tmp_path / "bad.json").write_text("[1]")
    with pytest.raises(SystemExit, match=r"bad\.json: not a `flashnpc eval --json` report"):
        module.main([str(paths[0]), str(tmp_path / "bad.json")])
