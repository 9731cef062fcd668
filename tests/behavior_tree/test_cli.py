"""``flashnpc bt validate | render | demo``, through the real ``flashnpc`` entry point."""

from __future__ import annotations

from pathlib import Path

import pytest

from behavior_tree.demo import EXAMPLES_DIR
from plugin.cli import main

EXAMPLES = sorted(EXAMPLES_DIR.glob("*.xml"))


def write(tmp_path: Path, body: str, models: str = "", name: str = "tree.xml") -> Path:
    path = tmp_path / name
    model_block = f"<TreeNodesModel>{models}</TreeNodesModel>" if models else ""
    path.write_text(
        f'<root BTCPP_format="4" main_tree_to_execute="Main">\n'
        f'<BehaviorTree ID="Main">\n{body}\n</BehaviorTree>\n{model_block}\n</root>\n',
        encoding="utf-8",
    )
    return path


# --------------------------------------------------------------------------- validate


def test_the_example_trees_validate(capsys: pytest.CaptureFixture[str]) -> None:
    assert [p.name for p in EXAMPLES] == ["guard.xml", "innkeeper.xml", "merchant.xml"]
    assert main(["bt", "validate", *map(str, EXAMPLES)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and all(": OK: " in line for line in out)
    assert "Guard (22 nodes, main), Patrol (6 nodes), Rest (5 nodes)" in out[0]
    assert "custom nodes from TreeNodesModel: MoveTo, NextWaypoint, PlayAnimation" in out[0]


def test_an_undeclared_custom_node_is_an_error_naming_file_line_and_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, '<Sequence>\n  <AlwaysSuccess/>\n  <Dance style="fast"/>\n</Sequence>')
    assert main(["bt", "validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:5" in err
    assert "Dance" in err and "unknown node ID" in err
    assert "TreeNodesModel" in err


def test_a_custom_node_declared_in_the_model_validates_with_its_ports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    models = """
      <Action ID="Dance"><input_port name="style" type="std::string">how to dance</input_port>
        <input_port name="beats" type="int" default="4"/></Action>
      <Condition ID="IsMusicOn">
        <MetadataFields><Metadata genre="folk"/></MetadataFields>
      </Condition>
      <Control ID="Shuffle"/>
      <Decorator ID="Twice"><input_port name="gap" type="double"/></Decorator>"""
    body = """<Shuffle>
      <IsMusicOn/>
      <Twice gap="0.5"><Dance style="fast" beats="8"/></Twice>
    </Shuffle>"""
    path = write(tmp_path, body, models)
    assert main(["bt", "validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Main (4 nodes, main)" in out
    assert "Dance, IsMusicOn, Shuffle, Twice" in out


@pytest.mark.parametrize(
    ("body", "models", "expected"),
    [
        (  # a literal that does not convert to the declared port type
            '<Dance beats="many"/>',
            '<Action ID="Dance"><input_port name="beats" type="int"/></Action>',
            ["tree.xml:3", "Dance", "'beats'", "'many'"],
        ),
        (  # a port the model does not declare
            '<Dance tempo="3"/>',
            '<Action ID="Dance"><input_port name="beats" type="int"/></Action>',
            ["tree.xml:3", "unknown port 'tempo'"],
        ),
        (  # a required port left out
            "<Dance/>",
            '<Action ID="Dance"><input_port name="beats" type="int"/></Action>',
            ["tree.xml:3", "missing required input port 'beats'"],
        ),
        (  # a script that does not compile
            '<Sequence>\n<Script name="count" code="n := (1 + "/>\n</Sequence>',
            "",
            ["tree.xml:4", "count", "code", "column"],
        ),
        (  # a pre-condition script that does not compile
            '<AlwaysSuccess name="x" _skipIf="a &amp;&amp;"/>',
            "",
            ["tree.xml:3", "_skipIf"],
        ),
        (  # a decorator with two children
            "<Inverter><AlwaysSuccess/><AlwaysFailure/></Inverter>",
            "",
            ["tree.xml:3", "Inverter", "children"],
        ),
    ],
)
def test_validation_errors_name_file_line_node_and_problem(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    body: str,
    models: str,
    expected: list[str],
) -> None:
    path = write(tmp_path, body, models)
    assert main(["bt", "validate", str(path)]) == 1
    err = capsys.readouterr().err
    for fragment in expected:
        assert fragment in err, (fragment, err)


def test_malformed_xml_and_missing_files_fail_with_the_file_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.xml"
    broken.write_text('<root BTCPP_format="4">\n<BehaviorTree ID="M">\n<Sequence>\n</root>\n')
    missing = tmp_path / "missing.xml"
    assert main(["bt", "validate", str(broken), str(missing)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"error: {broken}:4") and "malformed XML" in err[0]
    assert err[1] == f"error: {missing}: cannot read: No such file or directory"


def test_every_behavior_tree_in_the_file_is_checked_not_only_the_main_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "two.xml"
    path.write_text(
        '<root BTCPP_format="4" main_tree_to_execute="Main">\n'
        '<BehaviorTree ID="Main"><AlwaysSuccess/></BehaviorTree>\n'
        '<BehaviorTree ID="Unused"><Wobble/></BehaviorTree>\n'
        "</root>\n"
    )
    assert main(["bt", "validate", str(path)]) == 1
    assert f"{path}:3" in capsys.readouterr().err


def test_a_library_file_without_a_main_tree_validates_each_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "library.xml"
    path.write_text(
        '<root BTCPP_format="4">\n'
        '<BehaviorTree ID="Wave"><AlwaysSuccess/></BehaviorTree>\n'
        '<BehaviorTree ID="Bow"><Inverter><AlwaysFailure/></Inverter></BehaviorTree>\n'
        "</root>\n"
    )
    assert main(["bt", "validate", str(path)]) == 0
    assert "2 tree(s): Wave (1 nodes), Bow (2 nodes)" in capsys.readouterr().out
    assert main(["bt", "render", str(path)]) == 1
    assert "pick one with --tree (have: Wave, Bow)" in capsys.readouterr().err
    assert main(["bt", "render", str(path), "--tree", "Bow"]) == 0
    assert "Inverter" in capsys.readouterr().out


def test_stand_ins_keep_the_declared_port_types_defaults_and_descriptions(tmp_path: Path) -> None:
    from behavior_tree.cli import validation_factory
    from behavior_tree.xml_io import parse_xml

    path = write(
        tmp_path,
        "<Dance/>",
        """<Action ID="Dance">
             <input_port name="beats" type="int" default="4">beats per bar</input_port>
             <output_port name="done" type="bool"/>
             <inout_port name="mood" type="SomeCustomType" description="how it feels"/>
           </Action>""",
    )
    factory, added = validation_factory(parse_xml(path.read_text()))
    assert added == ["Dance"]
    ports = {p.name: p for p in factory.registration("Dance").ports}
    assert (ports["beats"].type, ports["beats"].default) == (int, 4)
    assert ports["beats"].description == "beats per bar"
    assert ports["done"].type is bool and ports["done"].is_output
    assert ports["mood"].type is None and ports["mood"].description == "how it feels"


def test_a_declared_only_node_refuses_to_tick(tmp_path: Path) -> None:
    from behavior_tree import Status
    from behavior_tree.cli import load_for_tools

    path = write(tmp_path, "<Dance/>", '<Action ID="Dance"/>')
    definitions, main_id, stand_ins = load_for_tools(path)
    assert (main_id, stand_ins) == ("Main", ["Dance"])
    tree = definitions["Main"].instantiate()
    assert tree.tick() is Status.FAILURE
    assert "only declared in TreeNodesModel" in str(tree.errors[0].exception)


# --------------------------------------------------------------------------- render


def test_render_prints_mermaid_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bt", "render", str(EXAMPLES_DIR / "guard.xml")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("flowchart TD\n")
    assert 'n0[["guard<br/>(ReactiveFallback)"]]' in out
    assert out.count(" --> ") == 21  # 22 nodes


def test_render_writes_dot_to_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "merchant.dot"
    args = ["bt", "render", str(EXAMPLES_DIR / "merchant.xml"), "--format", "dot", "--out"]
    assert main([*args, str(target)]) == 0
    assert f"wrote {target}" in capsys.readouterr().out
    text = target.read_text()
    assert text.startswith('digraph "Merchant" {') and text.count(" -> ") == 30


def test_render_picks_a_tree_and_can_show_ports(capsys: pytest.CaptureFixture[str]) -> None:
    guard = str(EXAMPLES_DIR / "guard.xml")
    assert main(["bt", "render", guard, "--tree", "Patrol", "--ports"]) == 0
    out = capsys.readouterr().out
    assert 'n0[["patrol<br/>(Sequence)"]]' in out and "seconds=30" in out
    assert main(["bt", "render", guard, "--tree", "Nope"]) == 1
    assert "no BehaviorTree 'Nope' (have: Guard, Patrol, Rest)" in capsys.readouterr().err


def test_render_of_an_invalid_file_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "<Wobble/>")
    assert main(["bt", "render", str(path)]) == 1
    assert "Wobble" in capsys.readouterr().err


# --------------------------------------------------------------------------- demo


def test_demo_subcommand_runs_the_guard_demo(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bt", "demo", "--seed", "2", "--ticks", "4"]) == 0
    out = capsys.readouterr().out
    assert "seed 2, 4 ticks" in out and "tick  4" in out and "flowchart TD" in out
    assert main(["bt", "demo", "--ticks", "0"]) == 1
    assert "--ticks must be at least 1" in capsys.readouterr().err


def test_bt_without_a_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bt"])
    assert info.value.code == 2
    assert "SUBCOMMAND" in capsys.readouterr().err
