from plugin.cli import build_parser, main


def test_cli_without_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "flashnpc" in capsys.readouterr().out


def test_cli_lists_bt_subcommand():
    parser = build_parser()
    assert "bt" in parser.format_help()
