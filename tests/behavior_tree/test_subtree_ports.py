"""SubTree ports as BT.CPP 4.10 wires them: typed literals, model defaults, _autoremap with
literals, keys created when the tree is built, and ``{key}`` with spaces around it."""

from __future__ import annotations

import pytest

from behavior_tree import Blackboard, InputPort, PortError, Status

from .conftest import wrap

S, F = Status.SUCCESS, Status.FAILURE


def sub(body: str, tree_id: str = "Sub") -> str:
    return f'<BehaviorTree ID="{tree_id}">{body}</BehaviorTree>'


def sayer(factory, port_type: type | None = None) -> list:
    """Register ``Say`` (port ``m``), which records what it reads; returns the record."""
    said: list = []
    factory.register_action("Say", lambda ctx: said.append(ctx.get_input("m")) or True,
                            ports=[InputPort("m", type=port_type)])
    return said


def test_literal_subtree_ports_arrive_typed_like_convert_from_string(factory):
    tree = factory.create_tree(wrap(
        '<SubTree ID="Sub" int_val="42" dbl_val="3.14" flag="true" text="hello" pose="1;2"/>',
        sub('<Sequence><ScriptCondition code="int_val + 1 == 43"/>'
            '<ScriptCondition code="dbl_val &gt; 3.0"/>'
            '<ScriptCondition code="flag == true"/>'  # "true" stays a string, compares as 1
            "<ScriptCondition code=\"text == 'hello' &amp;&amp; pose == '1;2'\"/></Sequence>")))
    assert tree.tick() is S, tree.errors
    inner = tree.find("Sub").child.blackboard
    assert inner.get("int_val") == 42 and inner.get("dbl_val") == 3.14
    assert inner.get("flag") == "true" and inner.get("pose") == "1;2"


def test_a_typed_string_port_reads_a_numeric_literal_as_text(factory):
    said = sayer(factory, str)
    tree = factory.create_tree(wrap('<SubTree ID="Sub" n="42"/>', sub('<Say m="{n}"/>')))
    assert tree.tick() is S and said == ["42"]


def test_literals_with_autoremap_stay_in_each_instance_and_out_of_the_callers_blackboard(
        factory):
    said = sayer(factory)
    tree = factory.create_tree(wrap(
        '<Sequence><SubTree ID="Sub" msg1="foo1" _autoremap="true"/>'
        '<SubTree ID="Sub" msg1="foo2" _autoremap="true"/></Sequence>',
        sub('<Sequence><Say m="{msg1}"/><Say m="{msg2}"/></Sequence>')),
        blackboard=Blackboard.from_dict({"msg2": "bar"}))
    assert tree.tick() is S
    assert said == ["foo1", "bar", "foo2", "bar"]  # msg2 reached through autoremap
    assert "msg1" not in tree.blackboard


def test_a_remapped_key_exists_once_the_tree_is_built(factory):
    # `=` assigns existing keys only; the SubTree's {myParam} created it at build time
    said = sayer(factory)
    tree = factory.create_tree(wrap(
        "<Sequence><Script code=\"myParam = 'hello'\"/><SubTree ID=\"Sub\" param=\"{myParam}\"/>"
        "<Script code=\"myParam = 'world'\"/><SubTree ID=\"Sub\" param=\"{myParam}\"/></Sequence>",
        sub('<Say m="{param}"/>')))
    assert "myParam" not in tree.blackboard and tree.blackboard.has_entry("myParam")
    assert tree.tick() is S, tree.errors
    assert said == ["hello", "world"]


def test_any_port_bound_to_a_key_creates_the_entry_at_build_time(factory):
    factory.register_action("Use", lambda ctx: True, ports=["target"])
    tree = factory.create_tree(wrap('<Sequence><Script code="goal = 3"/><Use target="{goal}"/>'
                                    "</Sequence>"))
    assert tree.tick() is S and tree.blackboard.get("goal") == 3


def test_a_key_with_spaces_around_the_braces_is_still_a_remap(factory):
    tree = factory.create_tree(wrap(
        '<Sequence><Script code="value := 7"/><SubTree ID="Sub" param="{value}  "/></Sequence>',
        sub('<ScriptCondition code="param == 7"/>')))
    assert tree.tick() is S, tree.errors


MODEL = ('<TreeNodesModel><SubTree ID="Sub">'
         '<input_port name="in_value" default="42"/><input_port name="in_name"/>'
         '<output_port name="out_result" default="{output}"/><output_port name="out_state"/>'
         "</SubTree></TreeNodesModel>")
MODEL_SUB = sub("<Sequence><ScriptCondition code=\"in_name == 'john' &amp;&amp; in_value == 42\"/>"
                "<Script code=\"out_result := 69; out_state := 'ACTIVE'\"/></Sequence>")


def test_subtree_model_defaults_fill_the_ports_a_subtree_does_not_set(factory):
    tree = factory.create_tree(wrap(
        "<Sequence><Script code=\"my_name := 'john'\"/>"
        '<SubTree ID="Sub" in_name="{my_name}" out_state="{my_state}"/>'
        "<ScriptCondition code=\"output == 69 &amp;&amp; my_state == 'ACTIVE'\"/></Sequence>",
        MODEL_SUB + MODEL))
    assert tree.tick() is S, tree.errors  # in_value=42 and out_result={output} from the model


def test_a_model_port_without_default_must_be_set(factory):
    with pytest.raises(PortError, match="declares port 'in_name' without a default") as e:
        factory.load(wrap('<SubTree ID="Sub" out_state="{s}"/>', MODEL_SUB + MODEL))
    assert e.value.line == 1 and "SubTree ID='Sub'" in str(e.value)


def test_with_autoremap_the_model_defaults_are_not_applied(factory):
    tree = factory.create_tree(wrap('<SubTree ID="Sub" _autoremap="true"/>',
                                    sub('<ScriptCondition code="in_value == 42"/>') + MODEL))
    assert tree.tick() is F  # in_value unknown: the script fails, recorded on the tree
    assert "in_value" in str(tree.errors[0].exception)
