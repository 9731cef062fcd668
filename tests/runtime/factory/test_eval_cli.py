"""`flashnpc eval`: the plain invocation still works beside the blind/unblind subcommands, and it
writes the writer figures to eval.json and a readable table to stdout."""

from __future__ import annotations

import json

import pytest

from plugin.cli import build_parser, main
from runtime.client.sampling import DEFAULT_TEMPERATURE, DEFAULT_TOP_P
from runtime.factory.writer_eval import SHAPES, SIDES, WRITER_THRESHOLDS


def test_plain_eval_invocation_parses_as_before():
    args = build_parser().parse_args(["eval", "--model", "m", "--json", "e.json", "--fast", "--seed", "2"])
    assert args.eval_command is None and str(args.model) == "m" and str(args.json) == "e.json"
    assert args.fast and args.seed == 2
    blind = build_parser().parse_args(["eval", "--seed", "5", "blind", "--out", "r.csv"])
    assert blind.eval_command == "blind" and blind.seed == 5 and blind.model is None
    blind = build_parser().parse_args(["eval", "blind", "--model", "m", "--seed", "4", "--out", "r.csv"])
    assert str(blind.model) == "m" and blind.seed == 4 and blind.model_lines == 100


def test_eval_without_json_or_subcommand_says_what_is_needed(capsys):
    assert main(["eval"]) == 2
    assert "--json OUT is required" in capsys.readouterr().err


def test_eval_writes_the_writer_figures_and_prints_their_table(shipped_fast_report, monkeypatch, tmp_path, capsys):
    seen = {}

    def fake_evaluate(model_dir, *, line_book, cfg, progress, progress_bar):
        seen.update(model_dir=model_dir, cfg=cfg, progress_bar=progress_bar)
        return shipped_fast_report

    monkeypatch.setattr("runtime.factory.evaluate.evaluate", fake_evaluate)
    out = tmp_path / "eval.json"
    code = main(["eval", "--fast", "--seed", "0", "--json", str(out), "--no-progress"])
    assert code == (0 if shipped_fast_report["passed"] else 1)
    assert seen["cfg"].writer_samples == 70 and seen["progress_bar"] is False
    printed = capsys.readouterr().out
    assert "fidelity_seen" in printed  # the existing figures
    assert "writer figures, seen pairs" in printed and "writer figures, heldout pairs" in printed
    report = json.loads(out.read_text())
    writer = report["writer"]
    assert set(writer["cells"]) == set(SHAPES)
    assert all(set(writer["cells"][s]) == set(SIDES) for s in SHAPES)
    assert len(writer["checks"]) == len(SHAPES) * len(SIDES) * len(WRITER_THRESHOLDS)
    assert report["passed"] == (writer["passed"] and all(v is not False for v in report["checks"].values()))


def test_eval_samples_at_the_temperature_and_nucleus_asked(shipped_fast_report, monkeypatch, tmp_path):
    seen = {}

    def fake_evaluate(model_dir, *, line_book, cfg, progress, progress_bar):
        seen["cfg"] = cfg
        return shipped_fast_report

    monkeypatch.setattr("runtime.factory.evaluate.evaluate", fake_evaluate)
    main(["eval", "--fast", "--json", str(tmp_path / "a.json"), "--no-progress"])
    assert (seen["cfg"].temperature, seen["cfg"].top_p) == (DEFAULT_TEMPERATURE, DEFAULT_TOP_P)  # the engine's
    main(["eval", "--fast", "--temperature", "1.0", "--top-p", "0.9", "--json", str(tmp_path / "b.json"),
          "--no-progress"])
    assert (seen["cfg"].temperature, seen["cfg"].top_p) == (1.0, 0.9)
    assert seen["cfg"].writer_samples == 70  # the rest of --fast kept


@pytest.mark.parametrize(("argv", "needle"), [
    (["eval", "--temperature", "0", "--json", "e.json"], "--temperature must be > 0"),
    (["eval", "--top-p", "1.5", "--json", "e.json"], "top_p must be in (0, 1], got 1.5"),
    (["eval", "blind", "--out", "r.csv", "--versus-temperature", "1.0"], "need --versus MODEL"),
    (["eval", "blind", "--out", "r.csv", "--versus", "m", "--versus-top-p", "0"], "top_p must be in (0, 1]"),
])
def test_eval_refuses_a_decoding_it_cannot_sample(argv, needle, capsys):
    assert main(argv) == 2
    assert needle in capsys.readouterr().err
