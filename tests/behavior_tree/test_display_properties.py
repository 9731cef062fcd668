"""Property tests: for random trees with hostile node names, both renderers keep
one declaration per node, one edge per parent-child pair, and labels that decode
back to exactly the node's name and ID."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from behavior_tree import Factory
from behavior_tree import builder as b
from behavior_tree.display import to_dot, to_mermaid

NAME_CHARS = list("ab Z09_-\"'<>&#`\\{}[]()|;:/%\né漢")
names = st.text(alphabet=NAME_CHARS, min_size=1, max_size=10)


@st.composite
def trees(draw: st.DrawFn, depth: int = 3) -> b.BNode:
    name = draw(names)
    kind = draw(st.sampled_from(["leaf", "leaf", "control", "decorator"] if depth else ["leaf"]))
    if kind == "leaf":
        return b.node(draw(st.sampled_from(["AlwaysSuccess", "AlwaysFailure"])), name=name)
    if kind == "decorator":
        return b.node("Inverter", draw(trees(depth - 1)), name=name)
    children = draw(st.lists(trees(depth - 1), min_size=1, max_size=3))
    return b.node(draw(st.sampled_from(["Sequence", "Fallback"])), *children, name=name)


def expected_labels(definition) -> list[str]:
    return [s.name if s.name == s.id else f"{s.name}\n({s.id})" for s in definition.root.walk()]


MERMAID_ENTITY = re.compile(r"#(quot|lt|gt|amp|96|35);")
MERMAID_DECODE = {"quot": '"', "lt": "<", "gt": ">", "amp": "&", "96": "`", "35": "#"}
MERMAID_NODE = re.compile(
    r'^    n(\d+)(?:\[\[|\{\{|\(\[|\[/|\[)"([^"]*)"(?:\]\]|\}\}|\]\)|/\]|\])$'
)


def decode_mermaid(label: str) -> str:
    return MERMAID_ENTITY.sub(lambda m: MERMAID_DECODE[m.group(1)], label.replace("<br/>", "\n"))


DOT_NODE = re.compile(r'^  n(\d+) \[label="((?:[^"\\]|\\.)*)", shape=')


def decode_dot(label: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), label)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(trees())
def test_mermaid_labels_decode_to_the_node_names_and_edges_match(root: b.BNode) -> None:
    definition = Factory().define(root)
    lines = to_mermaid(definition).splitlines()
    nodes = [MERMAID_NODE.match(line) for line in lines if re.match(r"^    n\d+[\[\{\(]", line)]
    assert all(nodes), lines
    assert [decode_mermaid(m.group(2)) for m in nodes] == expected_labels(definition)
    assert sum(bool(re.match(r"^    n\d+ --> n\d+$", line)) for line in lines) == len(nodes) - 1


@settings(max_examples=150, deadline=None, derandomize=True)
@given(trees())
def test_dot_labels_decode_to_the_node_names_and_edges_match(root: b.BNode) -> None:
    definition = Factory().define(root)
    lines = to_dot(definition).splitlines()
    nodes = [DOT_NODE.match(line) for line in lines if re.match(r"^  n\d+ \[", line)]
    assert all(nodes), lines
    assert [decode_dot(m.group(2)) for m in nodes] == expected_labels(definition)
    assert sum(bool(re.match(r"^  n\d+ -> n\d+;$", line)) for line in lines) == len(nodes) - 1
