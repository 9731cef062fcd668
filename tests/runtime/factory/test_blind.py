"""The blind-rating kit: `flashnpc eval blind` writes shuffled model and book lines with a hidden
key; `flashnpc eval unblind` refuses incomplete ratings with file:line errors and summarises."""

from __future__ import annotations

import csv
import json

import pytest

from plugin.cli import main
from runtime.factory.blind import (
    COLUMNS,
    RatingsError,
    describe_prompt,
    format_summary,
    key_path,
    read_ratings,
    summarise,
    write_blind,
)
from runtime.factory.writer_eval import SHAPES, SIDES, prompt_shape
from runtime.paths import DEFAULT_MODEL_DIR
from tests.runtime.factory.standin_book import StandinBook, StandinSampler


def _rows(path):
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _rate(path, rating_of):
    rows = _rows(path)
    for row in rows:
        row["rating"] = rating_of(row)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return rows


@pytest.fixture()
def kit(tmp_path):
    out = tmp_path / "rate" / "lines.csv"
    key = write_blind(out, book=StandinBook(), sampler=StandinSampler(), model_lines=20, book_lines=10, seed=3)
    return out, key


def test_blind_writes_shuffled_lines_and_a_key_beside_them(kit):
    out, key = kit
    assert key_path(out) == out.with_name("lines.key.json") and key_path(out).exists()
    assert json.loads(key_path(out).read_text()) == key
    rows = _rows(out)
    assert list(rows[0]) == list(COLUMNS) and len(rows) == 30
    assert [r["id"] for r in rows] == [f"r{i:02d}" for i in range(1, 31)]
    assert all(r["rating"] == "" for r in rows)
    items = {item["id"]: item for item in key["items"]}
    sources = [items[r["id"]]["source"] for r in rows]
    assert sources.count("model") == 20 and sources.count("book") == 10
    assert sources != sorted(sources)  # shuffled, not model then book
    for row in rows:
        item = items[row["id"]]
        assert row["line"] == item["line"] and row["prompt"] == item["prompt"]
        assert prompt_shape(item["persona"], list(item["context"]), 4) == item["shape"]
    model_cells = {(i["shape"], i["side"]) for i in key["items"] if i["source"] == "model"}
    assert model_cells == {(shape, side) for shape in SHAPES for side in SIDES}
    again = write_blind(out.with_name("again.csv"), book=StandinBook(), sampler=StandinSampler(),
                        model_lines=20, book_lines=10, seed=3)
    assert again["items"] == key["items"]


def test_prompts_read_like_a_brief():
    request = ("guard", ("gruff",), "alert", "ask_rumors", (("recent_event", "bandit_raid"), ("time_of_day", "night")))
    assert describe_prompt(request) == ("archetype: guard; state: alert; intent: ask rumors; persona: gruff; "
                                        "context: recent event: bandit raid, time of day: night")
    assert describe_prompt(("child", (), "rest", "greet", ())).endswith("persona: none; context: none")


def test_unblind_summarises_per_source_shape_and_side(kit):
    out, key = kit
    items = {item["id"]: item for item in key["items"]}
    _rate(out, lambda row: "2" if items[row["id"]]["source"] == "book" else
          "0" if items[row["id"]]["shape"] == "ctx0" else "1")
    summary = summarise(read_ratings(out))
    assert summary["book"]["all"] == {"n": 10, "shippable": 1.0, "clumsy": 0.0, "garbled": 0.0, "mean": 2.0}
    model = summary["model"]
    assert model["all"]["n"] == 20
    assert model["all"]["garbled"] == pytest.approx(4 / 20) and model["all"]["clumsy"] == pytest.approx(16 / 20)
    assert model["by_shape"]["ctx0"]["garbled"] == 1.0 and model["by_shape"]["full"]["clumsy"] == 1.0
    assert model["by_side"]["seen"]["n"] == 10
    table = format_summary(summary)
    assert "shippable" in table and "ctx0" in table and "heldout" in table


class FallingBackSampler(StandinSampler):
    """The stand-in sampler, saying that the engine would fall back on every third line."""

    def sample(self, requests, seed):
        lines = super().sample(requests, seed)
        self.last_fallbacks = [k % 3 == 0 for k in range(len(lines))]
        return lines


def test_unblind_reports_the_model_as_served_without_the_lines_the_engine_replaces(tmp_path):
    out = tmp_path / "lines.csv"
    key = write_blind(out, book=StandinBook(), sampler=FallingBackSampler(), model_lines=20,
                      book_lines=5, seed=3)
    model = [item for item in key["items"] if item["source"] == "model"]
    falls = {item["id"] for item in model if item["engine_falls_back"]}
    assert 0 < len(falls) < len(model)
    _rate(out, lambda row: "0" if row["id"] in falls else "2")  # the kit's cut lines read garbled
    summary = summarise(read_ratings(out))
    assert summary["model"]["all"]["garbled"] == pytest.approx(len(falls) / 20)
    assert summary["model"]["as_served"] == {"n": 20 - len(falls), "shippable": 1.0, "clumsy": 0.0,
                                             "garbled": 0.0, "mean": 2.0}
    assert summary["model"]["fallbacks"] == len(falls)
    assert "as served" in format_summary(summary)


class OtherSampler(StandinSampler):
    """A second stand-in model: the stand-in line, shouted."""

    def sample(self, requests, seed):
        return [line.upper() for line in super().sample(requests, seed)]


def test_versus_puts_a_second_models_line_on_every_prompt_and_unblinds_it_apart(tmp_path):
    out = tmp_path / "ab.csv"
    key = write_blind(out, book=StandinBook(), sampler=StandinSampler(), model_lines=20, book_lines=4,
                      seed=3, versus=OtherSampler(), versus_name="runs/other")
    assert key["versus"] == "runs/other"
    by_source = {s: [i for i in key["items"] if i["source"] == s] for s in ("model", "versus", "book")}
    assert [len(v) for v in by_source.values()] == [20, 20, 4]
    prompts = sorted(i["prompt"] for i in by_source["model"])
    assert sorted(i["prompt"] for i in by_source["versus"]) == prompts  # the same prompts, side by side
    line_of = {(i["source"], i["prompt"]): i["line"] for i in key["items"]}
    assert all(line_of[("versus", p)] == line_of[("model", p)].upper() for p in prompts)
    items = {i["id"]: i for i in key["items"]}
    _rate(out, lambda row: {"model": "2", "versus": "0", "book": "1"}[items[row["id"]]["source"]])
    summary = summarise(read_ratings(out))
    assert summary["model"]["all"]["shippable"] == 1.0 and summary["versus"]["all"]["garbled"] == 1.0
    assert summary["versus"]["as_served"]["n"] == 20 and summary["book"]["all"]["clumsy"] == 1.0
    assert any(row.startswith("versus") for row in format_summary(summary).splitlines())
    plain = summarise(read_ratings(*_kit_without_versus(tmp_path)))
    assert "versus" not in plain and "versus" not in format_summary(plain)


def _kit_without_versus(tmp_path):
    out = tmp_path / "plain.csv"
    write_blind(out, book=StandinBook(), sampler=StandinSampler(), model_lines=4, book_lines=2, seed=1)
    _rate(out, lambda row: "2")
    return (out,)


def test_unblind_refuses_missing_and_invalid_ratings_with_file_and_line(kit):
    out, _ = kit
    rows = _rate(out, lambda row: "1")
    rows[2]["rating"] = ""
    rows[5]["rating"] = "3"
    rows[7]["rating"] = "good"
    rows[9]["id"] = "r99"
    rows[11]["id"] = rows[10]["id"]
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    with pytest.raises(RatingsError) as err:
        read_ratings(out)
    problems = err.value.problems
    assert problems[0].startswith(f"{out}:4: rating: missing")  # row 3 is the file's line 4
    assert problems[1].startswith(f"{out}:7: rating: '3' is not a rating")
    assert problems[2].startswith(f"{out}:9: rating: 'good' is not a rating")
    assert problems[3] == f"{out}:11: id: 'r99' is not in the key lines.key.json"
    assert problems[4] == f"{out}:13: id: r11 repeats line 12"
    assert problems[5].startswith(f"{out}: rows missing for id(s) r10, r12")
    assert len(problems) == 6


def test_unblind_refuses_a_file_without_its_key_or_columns(kit, tmp_path):
    out, _ = kit
    moved = tmp_path / "elsewhere.csv"
    moved.write_text(out.read_text())
    with pytest.raises(RatingsError, match="key file is missing"):
        read_ratings(moved)
    out.write_text("id,line\nr01,Halt!\n")
    with pytest.raises(RatingsError, match=r":1: header: missing column\(s\) prompt, rating"):
        read_ratings(out)


def test_cli_blind_then_unblind_with_the_shipped_model(tmp_path, capsys):
    out = tmp_path / "ratings.csv"
    assert main(["eval", "blind", "--model-lines", "10", "--book-lines", "5", "--seed", "1", "--out", str(out)]) == 0
    assert "15 lines to rate" in capsys.readouterr().out
    key = json.loads(key_path(out).read_text())
    assert {i["shape"] for i in key["items"] if i["source"] == "model"} == set(SHAPES)
    assert main(["eval", "unblind", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{out}:2: rating: missing" in err and "15 problem(s)" in err
    _rate(out, lambda row: "2")
    summary_path = tmp_path / "summary.json"
    assert main(["eval", "unblind", str(out), "--json", str(summary_path)]) == 0
    assert "model" in capsys.readouterr().out
    summary = json.loads(summary_path.read_text())
    assert summary["model"]["all"]["n"] == 10 and summary["book"]["all"]["shippable"] == 1.0


def test_cli_blind_versus_one_model_at_two_temperatures(tmp_path, capsys):
    """Two decodings of one model side by side: each side sampled at its own temperature, the key
    naming both, so the A/B unblinds apart."""
    out = tmp_path / "ab.csv"
    model = str(DEFAULT_MODEL_DIR)
    assert main(["eval", "blind", "--model", model, "--temperature", "1.0", "--versus", model,
                 "--versus-temperature", "0.8", "--model-lines", "10", "--book-lines", "0", "--seed", "2",
                 "--out", str(out), "--no-progress"]) == 0
    key = json.loads(key_path(out).read_text())
    assert key["model"].endswith("(temperature 1, top-p 0.95)")
    assert key["versus"].endswith("(temperature 0.8, top-p 0.95)")
    lines = {s: [i["line"] for i in key["items"] if i["source"] == s] for s in ("model", "versus")}
    assert len(lines["model"]) == len(lines["versus"]) == 10
    assert lines["model"] != lines["versus"]  # the same seeds, another temperature
