from plugin.cli import build_parser, main


def test_cli_without_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "flashnpc" in capsys.readouterr().out


def test_cli_lists_bt_subcommand():
    parser = build_parser()
    assert "bt" in parser.format_help()


def test_cli_starts_without_importing_torch_or_onnxruntime():
    """A game client installs without torch: building the parser must not need it."""
    import subprocess
    import sys

    code = (
        "import sys; from plugin.cli import build_parser; build_parser();"
        "print(sorted(m for m in ('torch', 'onnxruntime') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
