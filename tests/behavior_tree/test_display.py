"""DOT and Mermaid rendering: structure, shapes, live colours and escaping."""

from __future__ import annotations

import re

import pytest

from behavior_tree import Factory, Status
from behavior_tree.display import STATUS_COLORS, render, statuses_from_trace, to_dot, to_mermaid

XML = """
<root BTCPP_format="4" main_tree_to_execute="Guard">
  <BehaviorTree ID="Guard">
    <ReactiveFallback name="root">
      <Sequence name="fight">
        <ScriptCondition name="hostile near" code="hostile"/>
        <AlwaysSuccess name="attack"/>
      </Sequence>
      <Inverter>
        <AlwaysSuccess name="look"/>
      </Inverter>
      <SubTree ID="Patrol"/>
    </ReactiveFallback>
  </BehaviorTree>
  <BehaviorTree ID="Patrol">
    <Sleep name="walk" msec="500"/>
  </BehaviorTree>
</root>
"""


@pytest.fixture
def definition():
    return Factory().load(XML)


@pytest.fixture
def ticked_tree(definition):
    tree = definition.instantiate(clock=lambda: 0.0)
    tree.blackboard.set("hostile", False)
    tree.enable_trace()
    assert tree.tick() is Status.RUNNING
    return tree


def mermaid_nodes(text: str) -> dict[str, str]:
    """node id -> the rest of its declaration line."""
    return dict(re.findall(r"^    (n\d+)([\[\(\{].*)$", text, re.M))


def mermaid_edges(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^    (n\d+) --> (n\d+)$", text, re.M)


def mermaid_classes(text: str) -> dict[str, str]:
    """node id -> class name, from the `class a,b name` lines."""
    out = {}
    for ids, name in re.findall(r"^    class ([\w,]+) (\w+)$", text, re.M):
        for node in ids.split(","):
            out[node] = name
    return out


def dot_nodes(text: str) -> dict[str, str]:
    return dict(re.findall(r"^  (n\d+) \[(.*)\];$", text, re.M))


def dot_edges(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^  (n\d+) -> (n\d+);$", text, re.M)


EXPECTED_EDGES = [
    ("n0", "n1"), ("n0", "n4"), ("n0", "n6"),
    ("n1", "n2"), ("n1", "n3"),
    ("n4", "n5"),
    ("n6", "n7"),
]  # fmt: skip


def test_mermaid_has_one_node_per_tree_node_and_parent_child_edges(definition) -> None:
    text = to_mermaid(definition)
    assert text.startswith("flowchart TD\n")
    assert len(mermaid_nodes(text)) == 8
    assert sorted(mermaid_edges(text)) == sorted(EXPECTED_EDGES)


def test_dot_has_the_same_structure_as_mermaid(definition) -> None:
    text = to_dot(definition)
    assert text.startswith('digraph "Guard" {')
    assert text.rstrip().endswith("}")
    assert len(dot_nodes(text)) == 8
    assert sorted(dot_edges(text)) == sorted(EXPECTED_EDGES)


def test_labels_show_the_name_and_the_registration_id_when_they_differ(definition) -> None:
    nodes = mermaid_nodes(to_mermaid(definition))
    assert '"root<br/>(ReactiveFallback)"' in nodes["n0"]
    assert '"Inverter"' in nodes["n4"]  # unnamed: the ID is the name, shown once
    assert '"Patrol<br/>(SubTree)"' in nodes["n6"]
    dot = dot_nodes(to_dot(definition))
    assert 'label="hostile near\\n(ScriptCondition)"' in dot["n2"]


def test_shapes_follow_the_node_kind(definition) -> None:
    nodes = mermaid_nodes(to_mermaid(definition))
    assert nodes["n0"].startswith("[[") and nodes["n0"].endswith("]]")  # control
    assert nodes["n2"].startswith("([") and nodes["n2"].endswith("])")  # condition
    assert nodes["n3"].startswith('["') and nodes["n3"].endswith('"]')  # action
    assert nodes["n4"].startswith("{{") and nodes["n4"].endswith("}}")  # decorator
    assert nodes["n6"].startswith("[/") and nodes["n6"].endswith("/]")  # subtree
    dot = dot_nodes(to_dot(definition))
    assert "shape=box" in dot["n0"] and "rounded" in dot["n0"]
    assert "shape=ellipse" in dot["n2"]
    assert "shape=hexagon" in dot["n4"]
    assert "shape=box3d" in dot["n6"]


def test_a_definition_has_no_status_colours(definition) -> None:
    assert "classDef" not in to_mermaid(definition)
    assert all('fillcolor="#ffffff"' in attrs for attrs in dot_nodes(to_dot(definition)).values())


def test_live_tree_is_coloured_by_current_status(ticked_tree) -> None:
    classes = mermaid_classes(to_mermaid(ticked_tree))
    # the reactive fallback and the subtree path are RUNNING; the rest was reset to IDLE
    assert {n for n, c in classes.items() if c == "running"} == {"n0", "n6", "n7"}
    assert {n for n, c in classes.items() if c == "idle"} == {"n1", "n2", "n3", "n4", "n5"}
    text = to_mermaid(ticked_tree)
    assert f"classDef running fill:{STATUS_COLORS[Status.RUNNING]}" in text
    dot = dot_nodes(to_dot(ticked_tree))
    assert f'fillcolor="{STATUS_COLORS[Status.RUNNING]}"' in dot["n7"]
    assert f'fillcolor="{STATUS_COLORS[Status.IDLE]}"' in dot["n3"]


def test_statuses_from_the_last_trace_record_show_what_each_node_returned(ticked_tree) -> None:
    statuses = statuses_from_trace(ticked_tree.trace.records[-1])
    classes = mermaid_classes(to_mermaid(ticked_tree, statuses=statuses))
    assert classes["n2"] == "failure"  # hostile is false
    assert classes["n1"] == "failure"
    assert classes["n5"] == "success"  # look succeeded, the inverter turned it into a failure
    assert classes["n4"] == "failure"
    assert classes["n3"] == "idle"  # attack never ran
    assert classes["n7"] == "running"
    dot = dot_nodes(to_dot(ticked_tree, statuses=statuses))
    assert f'fillcolor="{STATUS_COLORS[Status.FAILURE]}"' in dot["n2"]
    assert f'fillcolor="{STATUS_COLORS[Status.SUCCESS]}"' in dot["n5"]


def test_skipped_nodes_are_light_blue() -> None:
    xml = """<root BTCPP_format="4"><BehaviorTree ID="T">
      <Sequence><AlwaysSuccess name="skipped" _skipIf="true"/><AlwaysSuccess name="done"/></Sequence>
    </BehaviorTree></root>"""
    tree = Factory().load(xml).instantiate()
    trace = tree.enable_trace()
    tree.tick()
    statuses = statuses_from_trace(trace.records[-1])
    assert statuses[1] is Status.SKIPPED
    classes = mermaid_classes(to_mermaid(tree, statuses=statuses))
    assert classes["n1"] == "skipped"
    assert f"classDef skipped fill:{STATUS_COLORS[Status.SKIPPED]}" in to_mermaid(
        tree, statuses=statuses
    )


def test_labels_are_escaped() -> None:
    xml = """<root BTCPP_format="4"><BehaviorTree ID="T">
      <Sequence name='say "hi" &lt;b&gt; #1 &amp; `x`\\n'><AlwaysSuccess/></Sequence>
    </BehaviorTree></root>"""
    definition = Factory().load(xml)
    mermaid = mermaid_nodes(to_mermaid(definition))["n0"]
    assert '"' not in mermaid[3:-3]  # only the delimiting quotes remain
    assert "#quot;hi#quot;" in mermaid
    assert "#lt;b#gt;" in mermaid
    assert "#35;1" in mermaid and "#amp;" in mermaid and "#96;x#96;" in mermaid
    dot = dot_nodes(to_dot(definition))["n0"]
    assert 'label="say \\"hi\\" <b> #1 & `x`\\\\n\\n(Sequence)"' in dot


def test_ports_can_be_shown_in_labels(definition) -> None:
    nodes = mermaid_nodes(to_mermaid(definition, show_ports=True))
    assert "code=hostile" in nodes["n2"]
    assert "msec=500" in nodes["n7"]
    assert "msec=500" in dot_nodes(to_dot(definition, show_ports=True))["n7"]


def test_rendering_works_from_a_node_and_render_dispatches_by_format(ticked_tree) -> None:
    assert sorted(mermaid_edges(to_mermaid(ticked_tree.root))) == sorted(EXPECTED_EDGES)
    assert render(ticked_tree, "dot").startswith("digraph")
    assert render(ticked_tree, "mermaid", direction="LR").startswith("flowchart LR")
    with pytest.raises(ValueError, match="unknown format 'svg'"):
        render(ticked_tree, "svg")
    with pytest.raises(ValueError, match="direction"):
        to_mermaid(ticked_tree, direction="UP")
    with pytest.raises(TypeError, match="expected a Tree"):
        to_dot("not a tree")


def test_rendering_is_deterministic(definition) -> None:
    assert to_mermaid(definition) == to_mermaid(definition)
    assert to_dot(definition.instantiate()) == to_dot(definition.instantiate())
