"""Tick traces and the node-walking API that renderers use."""

from __future__ import annotations

import json

from behavior_tree import Status

from .conftest import wrap

R, S, F, IDLE = Status.RUNNING, Status.SUCCESS, Status.FAILURE, Status.IDLE


def test_trace_records_returned_statuses_and_parent_resets(factory, probes):
    probes.action("A", "B")
    probes.set(A=S, B=R)
    tree = factory.create_tree(wrap("<Sequence><A/><B/></Sequence>"))
    trace = tree.enable_trace()
    tree.tick()
    probes.set(B=F)
    tree.tick()
    first, second = trace.records
    assert [str(t) for t in first.transitions] == [
        "A#1: IDLE -> SUCCESS", "B#2: IDLE -> RUNNING", "Sequence#0: IDLE -> RUNNING"]
    assert [str(t) for t in second.transitions] == [
        "B#2: RUNNING -> FAILURE", "Sequence#0: RUNNING -> FAILURE",
        "A#1: SUCCESS -> IDLE", "B#2: FAILURE -> IDLE"]
    assert first.tick == 1 and second.status is F
    rows = json.loads(trace.to_json())
    assert rows[1]["transitions"][0] == [2, "B", "RUNNING", "FAILURE"]
    assert "tick 2 (FAILURE)" in trace.format()


def test_halt_is_recorded_and_closing_restores_plain_classes(factory, probes):
    probes.stateful("Work")
    probes.set(Work=R)
    tree = factory.create_tree(wrap("<Inverter><Work/></Inverter>"))
    plain = type(tree.root)
    trace = tree.enable_trace(max_ticks=2)
    tree.tick()
    tree.halt()
    assert trace.records[-1].halted
    assert [t.new for t in trace.records[-1].transitions] == [IDLE, IDLE]
    for _ in range(3):
        tree.tick()
    assert len(trace.records) == 2  # bounded
    tree.disable_trace()
    assert type(tree.root) is plain and tree.trace is None


def test_walk_exposes_name_id_status_children_and_ports(factory):
    factory.register_action("Say", lambda ctx: True, ports=["line", "volume"])
    tree = factory.create_tree(wrap(
        '<Sequence name="talk"><Say line="{greeting}" volume="3"/></Sequence>'))
    tree.tick()
    (root, d0), (say, d1) = list(tree.walk())
    assert (root.name, root.id, d0, root.status) == ("talk", "Sequence", 0, S)
    assert (say.name, say.id, d1) == ("Say", "Say", 1)
    assert say.port_bindings() == {"line": "{greeting}", "volume": "3"}
    assert root.children == (say,)
    assert [n.uid for n in tree.nodes()] == [0, 1]
    assert tree.statuses() == [S, IDLE]
