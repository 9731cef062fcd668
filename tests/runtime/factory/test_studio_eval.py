"""flashnpc eval studio: held-out cells, served against the rule pick, and the blind sheet."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from runtime.factory import studio_eval as se
from runtime.factory.blind import RatingsError
from runtime.factory.finetune import StudioLine

SL = StudioLine
LINES = [SL("smuggler", s, f"{s.title()} line {i} for {it}.", intent=it)
         for s in ("alert", "idle", "working") for it in ("greet", "trade", "farewell") for i in range(3)]


def test_held_out_cells_are_left_out_whole_and_drawn_by_the_seed():
    train, held = se.split_cells(LINES, 0.25, seed=7)
    assert len(held) == 2  # 9 cells
    assert not any((ln.archetype, ln.state, ln.intent) in held for ln in train)
    assert len(train) == len(LINES) - 3 * len(held)
    assert se.split_cells(LINES, 0.25, seed=7)[1] == held
    assert any(se.split_cells(LINES, 0.25, seed=s)[1] != held for s in range(8))
    with pytest.raises(ValueError, match="--holdout"):
        se.split_cells(LINES, 1.0, seed=0)


def test_requests_take_the_tags_of_one_of_their_cells_lines():
    _, held = se.split_cells(LINES, 0.25, seed=7)
    reqs = se.draw_requests(LINES, held, n_covered=4, seed=7)
    assert [r.side for r in reqs] == ["uncovered"] * 2 + ["covered"] * 4
    assert {r.cell for r in reqs if r.side == "uncovered"} == held
    assert all(r.writers in LINES for r in reqs)
    assert "the player: greet" in reqs[0].describe() or "the player:" in reqs[0].describe()


def test_the_cells_a_file_does_not_write_are_listed_for_the_writers():
    cat = {"states": ["alert", "idle", "working"], "intents": ["greet", "trade", "farewell"]}
    lines = [*LINES, SL("smuggler", "drunk", "Hic.", intent="wave")]
    todo = se.unwritten_cells(lines, cat)
    assert "smuggler/drunk/greet" in todo and "smuggler/alert/wave" in todo  # the file's own names count
    assert "smuggler/alert/greet" not in todo and "smuggler/drunk/wave" not in todo
    assert len(todo) == 4 * 4 - 9 - 1


def test_a_fallback_written_only_for_another_move_is_a_wrong_move():
    by_text = {"Go away.": {"threaten"}, "Hello there.": {"greet", "approach"}}
    assert se.wrong_move("Go away.", "greet", by_text)
    assert not se.wrong_move("Hello there.", "greet", by_text)
    assert not se.wrong_move("Hm.", "greet", by_text)  # generic
    assert not se.wrong_move("A village line.", "greet", by_text)  # not the studio's


def _rate(sheet: Path, rating_of, best_of) -> None:
    text = sheet.read_text().splitlines(keepends=True)
    rows = list(csv.DictReader(text[1:]))
    key = json.loads(se.sheet_key(sheet).read_text())["rows"]
    groups: dict[int, list[dict]] = {}
    for row in rows:
        row["rating"] = str(rating_of(key[row["id"]]["sources"]))
        groups.setdefault(key[row["id"]]["group"], []).append(row)
    for rows_of in groups.values():
        best_of(rows_of, key)["best"] = "x"
    with sheet.open("w", newline="") as f:
        f.write(text[0])
        w = csv.DictWriter(f, fieldnames=se.SHEET_COLUMNS)
        w.writeheader()
        w.writerows(rows)


def test_the_sheet_hides_sources_and_unblinds_per_side_and_source(tmp_path):
    reqs = [se.StudioRequest("covered", LINES[0]), se.StudioRequest("uncovered", LINES[4])]
    groups = [(reqs[0], {"served": LINES[0].text, "model": "A made up line.", "rule": LINES[1].text,
                         "writers": LINES[0].text}),
              (reqs[1], {"served": "Hm.", "rule": LINES[5].text, "writers": LINES[4].text})]
    sheet = tmp_path / "sheet.csv"
    se.write_sheet(sheet, groups, seed=1)
    body = sheet.read_text()
    assert "served" not in body and "writers" not in body and "rule" not in body.split("\n", 1)[1]
    assert body.count(LINES[0].text) == 1  # one row for a text two sources gave
    with pytest.raises(RatingsError) as info:
        se.read_sheet(sheet)
    assert any("rating ''" in p for p in info.value.problems)

    _rate(sheet, lambda src: 2 if "writers" in src else 0,
          lambda rows, key: next(r for r in rows if "writers" in key[r["id"]]["sources"]))
    summary = se.summarise_sheet(se.read_sheet(sheet))
    assert summary["covered"]["served"]["shippable_pct"] == 100.0 and summary["covered"]["served"]["best"] == 1
    assert summary["covered"]["model"]["garbled_pct"] == 100.0
    assert summary["covered"]["served_vs_rule"] == {"won": 1, "tied": 0, "lost": 0, "won_or_tied_pct": 100.0,
                                                    "won_of_decided_pct": 100.0}
    assert summary["uncovered"]["served_vs_rule"]["tied"] == 1  # both 0, neither best
    assert "served vs rule pick" in se.format_summary(summary)


def test_the_kit_fine_tunes_on_the_covered_cells_and_reports_both_sides(tiny_model_dir, tmp_path, one_torch_thread):
    pytest.importorskip("torch")
    from runtime.factory.finetune import FinetuneConfig

    rows = [{"archetype": "smuggler", "state": s, "line": f"The {s} smuggler answers {it.replace('_', ' ')}, "
             f"take {i}.", "intent": it, "like": "thief"}
            for s in ("alert", "idle") for it in ("greet", "trade", "farewell") for i in range(2)]
    lines = tmp_path / "studio.jsonl"
    lines.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = se.run_studio_eval(lines, tmp_path / "out", base=tiny_model_dir, share=0.34, n_covered=3, seed=0,
                                cfg=FinetuneConfig(steps=2, batch_size=4, replay=0.0), progress=False)
    assert report["counts"] == {"lines": 12, "train_lines": 8, "cells": 6, "heldout_cells": 2}
    served, alone = report["served"], report["model_alone"]
    assert served["covered"]["requests"] == 3 and served["uncovered"]["requests"] == 2
    assert served["covered"]["authored_pct"] == 100.0  # every covered request is played back
    assert alone["covered"]["authored_pct"] == 0.0
    assert served["uncovered"]["authored_pct"] == 0.0
    assert served["uncovered"]["wrong_move_fallbacks"] == 0
    train = [json.loads(x) for x in (tmp_path / "out" / "train.jsonl").read_text().splitlines()]
    assert len(train) == 8 and all(r["like"] == "thief" for r in train)
    sheet = Path(report["sheet"])
    key = json.loads(se.sheet_key(sheet).read_text())["rows"]
    assert {s for row in key.values() for s in row["sources"]} == {"served", "model", "rule", "writers"}
    assert json.loads((tmp_path / "out" / "report.json").read_text())["seed"] == 0
    # a later sitting reuses the fine-tune; another seed's split would leak its held-out cells
    again = se.run_studio_eval(lines, tmp_path / "again", base=tiny_model_dir, model=tmp_path / "out" / "model",
                               share=0.34, n_covered=3, seed=0, progress=False)
    assert again["finetune"] == {"reused": str(tmp_path / "out" / "model")}
    with pytest.raises(ValueError, match="not a fine-tune of this file's training cells"):
        se.run_studio_eval(lines, tmp_path / "other", base=tiny_model_dir, model=tmp_path / "out" / "model",
                           share=0.34, n_covered=3, seed=5, progress=False)
