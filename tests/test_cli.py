"""The `flashnpc` command line's conventions: one subcommand per export form, each refusing the
flags of the others; nothing written without --out; distinct default ports; --json where a
command reports figures; errors as one line and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from plugin.cli import build_parser, main


def test_cli_without_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "flashnpc" in capsys.readouterr().out


def test_cli_lists_bt_subcommand():
    parser = build_parser()
    assert "bt" in parser.format_help()


def test_cli_starts_without_importing_torch_or_onnxruntime():
    """A game client installs without torch: building the parser must not need it."""
    code = (
        "import sys; from plugin.cli import build_parser; build_parser();"
        "print(sorted(m for m in ('torch', 'onnxruntime', 'tqdm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``flashnpc argv``; argparse's exits count as statuses."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, command: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err
    assert lines[-1].startswith(f"{command}: error: "), err


# --------------------------------------------------------------------------- export


def test_a_bare_export_names_the_forms_and_writes_nothing(capsys):
    from runtime.paths import DEFAULT_MODEL_DIR

    before = {p.name: p.stat().st_mtime_ns for p in DEFAULT_MODEL_DIR.iterdir()}
    code, _, err = run(["export"], capsys)
    assert code == 2
    assert "onnx, mobile, client, genai" in err and "flashnpc export mobile --out" in err
    assert {p.name: p.stat().st_mtime_ns for p in DEFAULT_MODEL_DIR.iterdir()} == before


@pytest.mark.parametrize("form", ["onnx", "mobile", "client", "genai"])
def test_every_export_form_needs_out(form, capsys):
    code, _, err = run(["export", form], capsys)
    assert code == 2 and "--out" in err and f"flashnpc export {form}: error:" in err


@pytest.mark.parametrize(("argv", "refused"), [
    (["export", "mobile", "--accuracy-level", "0", "--bundle", "/nonexistent"], "--accuracy-level 0 --bundle"),
    (["export", "onnx", "--zip"], "--zip"),
    (["export", "onnx", "--target", "arm"], "--target"),
    (["export", "client", "--zip"], "--zip"),
    (["export", "client", "--variant", "dense"], "--variant"),
    (["export", "genai", "--genai"], "--genai"),
    (["export", "genai", "--bundle", "b"], "--bundle"),
])
def test_each_export_form_refuses_the_flags_it_does_not_use(argv, refused, tmp_path, capsys):
    code, _, err = run([*argv, "--out", str(tmp_path / "out")], capsys)
    assert code == 2
    assert f"flashnpc export {argv[1]}: error: unrecognized arguments: {refused}" in err
    assert not (tmp_path / "out").exists()


def test_export_client_takes_a_model_or_a_bundle_not_both(tmp_path, capsys):
    code, _, err = run(["export", "client", "--model", "m", "--bundle", "b", "--out", str(tmp_path / "c")], capsys)
    assert code == 2 and "not allowed with argument --model" in err


def test_export_onnx_and_mobile_report_a_missing_model_in_one_line(tmp_path, capsys):
    pytest.importorskip("onnx")
    code, _, err = run(["export", "onnx", "--model", str(tmp_path / "none"), "--out", str(tmp_path / "o")], capsys)
    assert code == 2
    assert_one_line_error(err, "flashnpc export onnx")
    code, _, err = run(["export", "mobile", "--model", str(tmp_path / "none"), "--out", str(tmp_path / "b")], capsys)
    assert code == 2
    assert_one_line_error(err, "flashnpc export mobile")


def test_export_genai_writes_the_folder_and_reports_it_as_json(tmp_path, capsys):
    out = tmp_path / "genai"
    code, stdout, _ = run(["export", "genai", "--out", str(out), "--json", "--no-progress"], capsys)
    assert code == 0
    report = json.loads(stdout)
    assert report["path"] == str(out) and report["files"]["genai_config.json"] > 0
    assert (out / "genai_config.json").is_file()
    code, _, err = run(["export", "genai", "--out", str(out)], capsys)  # exists: --force needed
    assert code == 2 and "already exists; pass --force" in err
    assert_one_line_error(err, "flashnpc export genai")
    assert run(["export", "genai", "--out", str(out), "--force", "--no-progress"], capsys)[0] == 0


# --------------------------------------------------------------------------- other commands


def test_serve_and_inspect_do_not_share_a_default_port():
    parser = build_parser()
    serve = parser.parse_args(["serve"])
    inspect = parser.parse_args(["inspect"])
    taken = {serve.port, serve.http_port, serve.dialogue_port, serve.dialogue_http_port}
    assert inspect.port not in taken


@pytest.mark.parametrize("argv", [
    ["train", "--out", "x"], ["export", "onnx", "--out", "x"], ["export", "mobile", "--out", "x"],
    ["export", "client", "--out", "x"], ["export", "genai", "--out", "x"], ["bundle", "verify", "x"],
    ["loadtest", "sync"], ["loadtest", "dialogue"], ["demo"],
])
def test_commands_that_report_figures_take_json(argv):
    args = build_parser().parse_args([*argv, "--json"])
    assert args.json is True


@pytest.mark.parametrize("argv", [
    ["export", "onnx", "--out", "x"], ["export", "mobile", "--out", "x"], ["export", "client", "--out", "x"],
    ["export", "genai", "--out", "x"], ["bundle", "verify", "x"], ["loadtest", "sync"], ["eval"],
    ["eval", "blind", "--out", "x.csv"],
])
def test_long_commands_can_turn_their_progress_bar_off(argv):
    assert build_parser().parse_args([*argv, "--no-progress"]).no_progress is True


@pytest.mark.parametrize(("argv", "code", "command"), [
    (["demo", "--npcs", "0"], 2, "flashnpc demo"),
    (["demo", "--model", "/nonexistent"], 1, "flashnpc demo"),
    (["inspect", "--npcs", "0"], 2, "flashnpc inspect"),
    (["eval"], 2, "flashnpc eval"),
    (["eval", "--model", "/nonexistent", "--json", "x.json"], 2, "flashnpc eval"),
    (["bundle", "verify", "/nonexistent", "--zip"], 2, "flashnpc bundle verify"),
    (["bundle", "sign", "/nonexistent", "--key", "/nonexistent"], 2, "flashnpc bundle sign"),
    (["loadtest", "sync", "--clients", "0"], 2, "flashnpc loadtest"),
    (["loadtest", "sync", "--churn", "2"], 2, "flashnpc loadtest"),
    (["loadtest", "dialogue", "--duration", "0"], 2, "flashnpc loadtest dialogue"),
    (["demo", "--bogus"], 2, "flashnpc demo"),
])
def test_bad_invocations_are_one_line_and_a_non_zero_exit(argv, code, command, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got, _, err = run(argv, capsys)
    assert got == code
    assert_one_line_error(err, command)


def test_a_rejected_bundle_exits_1_with_its_report(capsys):
    code, out, _ = run(["bundle", "verify", "/nonexistent", "--no-progress"], capsys)
    assert code == 1 and "REJECTED" in out


def test_serve_without_a_secret_is_one_line(capsys, monkeypatch):
    monkeypatch.delenv("FLASHNPC_SECRET", raising=False)
    code, _, err = run(["serve"], capsys)
    assert code == 2
    assert_one_line_error(err, "flashnpc serve")


def test_serve_with_a_bad_world_is_one_line(capsys, monkeypatch):
    monkeypatch.setenv("FLASHNPC_SECRET", "s" * 32)
    code, _, err = run(["serve", "--world", "sim:many", "--port", "0", "--http-port", "-1"], capsys)
    assert code == 1
    assert_one_line_error(err, "flashnpc serve")
    assert "expected sim:NPCS" in err


def test_train_rejects_bad_settings_in_one_line(capsys, tmp_path):
    pytest.importorskip("torch")
    code, _, err = run(["train", "--out", str(tmp_path / "t"), "--config", "{not json"], capsys)
    assert code == 2
    assert_one_line_error(err, "flashnpc train")
    code, _, err = run(["train", "--out", str(tmp_path / "t"), "--line-book", str(tmp_path / "none")], capsys)
    assert code == 2
    assert_one_line_error(err, "flashnpc train")


def test_bt_names_a_missing_file_in_one_line(capsys):
    code, _, err = run(["bt", "validate", "/nonexistent.xml"], capsys)
    assert code != 0 and "Traceback" not in err and "/nonexistent.xml" in err


# --------------------------------------------------------------------------- the dispatcher's guard


def test_expected_errors_are_one_line_and_exit_1(capsys, monkeypatch):
    import runtime.cli

    def fails(_args):
        raise FileNotFoundError(2, "No such file or directory", "/data/book")

    monkeypatch.setattr(runtime.cli, "run_train", fails)
    code, _, err = run(["train", "--out", "x"], capsys)
    assert code == 1 and err == "flashnpc train: error: /data/book: No such file or directory\n"

    from runtime.client.errors import ModelLoadError

    def fails_to_load(_args):
        raise ModelLoadError("model.int4.onnx: truncated\n(re-export it)")

    monkeypatch.setattr(runtime.cli, "run_train", fails_to_load)
    code, _, err = run(["train", "--out", "x"], capsys)
    assert code == 1 and err == "flashnpc train: error: model.int4.onnx: truncated (re-export it)\n"


def test_a_bug_still_shows_its_traceback(monkeypatch):
    import runtime.cli

    def bug(_args):
        raise ZeroDivisionError("a bug, not the user's input")

    monkeypatch.setattr(runtime.cli, "run_train", bug)
    with pytest.raises(ZeroDivisionError):
        main(["train", "--out", "x"])


def test_flashnpc_traceback_shows_the_traceback_of_an_expected_error(monkeypatch):
    import runtime.cli

    def fails(_args):
        raise PermissionError(13, "Permission denied", "/root/x")

    monkeypatch.setattr(runtime.cli, "run_train", fails)
    monkeypatch.setenv("FLASHNPC_TRACEBACK", "1")
    with pytest.raises(PermissionError):
        main(["train", "--out", "x"])


def test_an_interrupt_exits_130(capsys, monkeypatch):
    import runtime.cli

    def interrupted(_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(runtime.cli, "run_train", interrupted)
    code, _, err = run(["train", "--out", "x"], capsys)
    assert code == 130 and err == "flashnpc train: interrupted\n"


def test_demo_reports_its_figures_as_json(capsys):
    code, out, _ = run(["demo", "--npcs", "2", "--duration", "10", "--json"], capsys)
    assert code == 0
    report = json.loads(out)
    assert report["npcs"] == 2 and report["lines"] == len(report["transcript"]) > 0
    assert {"text", "npc_id", "latency_ms"} <= set(report["transcript"][0])
    assert report["generator"]["lines"] >= report["lines"]


def test_the_readme_commands_parse():
    """Every `flashnpc ...` line of README.md's command list parses as written."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    commands = [line.split("#")[0].strip() for line in readme.splitlines()
                if line.startswith("flashnpc ")]
    assert len(commands) >= 10
    parser = build_parser()
    for command in commands:
        args = parser.parse_args(command.split()[1:])
        assert args.command, command


LOADTEST_WITHOUT_MATPLOTLIB = """
import sys
from importlib.abc import MetaPathFinder

class NoMatplotlib(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoMatplotlib())
from plugin.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_loadtest_without_matplotlib_writes_its_report_and_says_the_plot_is_skipped(tmp_path):
    out = tmp_path / "lt"
    argv = ["loadtest", "sync", "--clients", "4", "--procs", "1", "--duration", "1", "--npcs", "10",
            "--changes", "20", "--size", "200", "--no-db", "--no-progress", "--out", str(out)]
    done = subprocess.run([sys.executable, "-c", LOADTEST_WITHOUT_MATPLOTLIB, *argv], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    notes = [line for line in (done.stdout + done.stderr).splitlines() if "matplotlib is not installed" in line]
    assert len(notes) == 1
    report = json.loads((out / "report.json").read_text())
    assert report["plot"] is None and report["zero_lost_updates"]
    assert not (out / "plot.png").exists()
    assert "zero lost updates" in done.stdout
