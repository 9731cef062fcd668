"""``flashnpc finetune`` as a command: ``--json`` prints only the report on stdout, and bad input
is the one-line ``flashnpc finetune: error: ...`` of every command (exit 1), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from plugin.cli import main

ROWS = "archetype,state,line\n" + ("smuggler,friendly,Keep your voice down and your purse open.\n"
                                   "smuggler,alert,Lanterns on the water. Douse yours quick.\n") * 3


def finetune(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["finetune", "--no-progress", "--threads", "1", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_prints_the_report_and_nothing_else_on_stdout(tiny_model_dir, tmp_path, capsys, one_torch_thread):
    lines = tmp_path / "lines.csv"
    lines.write_text(ROWS)
    rc, out, _ = finetune(capsys, "--base", str(tiny_model_dir), "--lines", str(lines), "--out",
                          str(tmp_path / "out"), "--steps", "1", "--replay", "0", "--json")
    assert rc == 0
    report = json.loads(out)
    assert report["steps"] == 1 and report["exported"] is True
    assert report["added"]["archetypes"] == ["smuggler"] and report["counts"]["lines"] == 6
    assert json.loads((tmp_path / "out" / "finetune.json").read_text())["steps"] == 1


@pytest.mark.parametrize(("args", "message"), [
    (["--lines", "{bad}"], "{bad}: 2 bad row(s) {bad}:3: state: 'patrols' is not one of the base model's states; "
                           "did you mean 'patrol'?"),
    (["--lines", "{missing}"], "{missing}: no such file"),
    (["--lines", "{good}", "--replay", "1.5"], "--replay must be in [0, 1), got 1.5"),
    (["--lines", "{good}", "--steps", "0"], "--steps must be >= 1, got 0"),
    (["--lines", "{good}", "--lr", "-1"], "--epochs and --lr must be > 0"),
    (["--lines", "{good}", "--base", "{missing}"], "--base {missing}"),
])
def test_bad_input_is_one_error_line_naming_what_and_where(tiny_model_dir, tmp_path, capsys, args, message):
    bad = tmp_path / "bad.csv"
    bad.write_text("archetype,state,line\nsmuggler,friendly,Fine.\nsmuggler,patrols,Fine.\n,idle,Nobody.\n")
    good = tmp_path / "good.csv"
    good.write_text(ROWS)
    names = {"bad": bad, "good": good, "missing": tmp_path / "missing"}
    rc, out, err = finetune(capsys, "--base", str(tiny_model_dir), "--out", str(tmp_path / "out"),
                            *[a.format(**names) for a in args])
    assert rc == 1 and out == ""
    assert err.startswith("flashnpc finetune: error: ") and err.count("\n") == 1, err
    assert message.format(**names) in err
    assert not Path(tmp_path / "out").exists()
