"""Pre/post conditions (_skipIf, _successIf, _failureIf, _while, _onSuccess, ...)."""

from __future__ import annotations

import pytest

from behavior_tree import NodeConfigError, Status

from .conftest import wrap

R, S, F, K, IDLE = (Status.RUNNING, Status.SUCCESS, Status.FAILURE, Status.SKIPPED, Status.IDLE)


@pytest.mark.parametrize(
    ("attr", "expected"), [("_skipIf", K), ("_successIf", S), ("_failureIf", F)]
)
def test_true_precondition_replaces_the_tick(factory, probes, attr, expected):
    probes.action("A")
    tree = factory.create_tree(wrap(f'<A {attr}="x == 1"/>'))
    tree.blackboard.set("x", 1)
    assert tree.tick() is expected
    assert probes.ticks["A"] == 0
    tree.blackboard.set("x", 2)
    assert tree.tick() is S and probes.ticks["A"] == 1


def test_failure_if_is_checked_before_success_if(factory, probes):
    probes.action("A")
    tree = factory.create_tree(wrap('<A _successIf="true" _failureIf="true"/>'))
    assert tree.tick() is F


def test_skip_if_is_only_checked_when_the_node_is_idle(factory, probes):
    probes.action("A")
    probes.set(A=R)
    tree = factory.create_tree(wrap('<A _skipIf="stop"/>'))
    tree.blackboard.set("stop", False)
    assert tree.tick() is R
    tree.blackboard.set("stop", True)
    assert tree.tick() is R  # already running: _skipIf is not re-evaluated
    assert probes.ticks["A"] == 2


def test_while_halts_a_running_node_when_it_turns_false(factory, probes):
    probes.stateful("Chase")
    probes.set(Chase=R)
    tree = factory.create_tree(wrap('<Chase _while="visible" _onHalted="gave_up := true"/>'))
    tree.blackboard.set("visible", True)
    assert tree.tick() is R
    tree.blackboard.set("visible", False)
    assert tree.tick() is K
    assert probes.halts["Chase"] == 1
    assert tree.find("Chase").status is IDLE
    assert tree.blackboard.get("gave_up") is True
    assert tree.tick() is K  # idle and false: skipped without starting


def test_post_conditions_run_on_the_matching_result(factory, probes):
    probes.action("A")
    tree = factory.create_tree(wrap(
        '<A _onSuccess="wins += 1" _onFailure="losses += 1" _post="done += 1"/>'))
    for k in ("wins", "losses", "done"):
        tree.blackboard.set(k, 0)
    tree.tick()
    probes.set(A=F)
    tree.tick()
    probes.set(A=R)
    tree.tick()  # RUNNING: no post-condition
    bb = tree.blackboard
    assert (bb.get("wins"), bb.get("losses"), bb.get("done")) == (1, 1, 2)


def test_on_halted_runs_only_when_a_running_node_is_halted(factory, probes):
    probes.action("A")
    tree = factory.create_tree(wrap('<A _onHalted="halted := true"/>'))
    tree.tick()
    tree.halt()
    assert "halted" not in tree.blackboard
    probes.set(A=R)
    tree.tick()
    tree.halt()
    assert tree.blackboard.get("halted") is True


def test_conditions_work_on_control_nodes_too(factory, probes):
    probes.action("A")
    tree = factory.create_tree(wrap('<Sequence _skipIf="off"><A/></Sequence>'))
    tree.blackboard.set("off", True)
    assert tree.tick() is K and probes.ticks["A"] == 0


def test_a_script_that_fails_at_runtime_is_recorded_and_fails_the_node(factory, probes):
    probes.action("A")
    tree = factory.create_tree(wrap('<A _skipIf="missing_key"/>'))
    assert tree.tick() is F
    assert tree.errors and "missing_key" in str(tree.errors[0].exception)


def test_a_script_that_does_not_parse_is_a_load_error_naming_node_and_attribute(factory, probes):
    probes.action("A")
    with pytest.raises(NodeConfigError, match="_skipIf") as e:
        factory.create_tree(wrap('<A name="eat" _skipIf="x =="/>'))
    assert "eat" in str(e.value)


def test_unknown_special_attribute_is_rejected(factory, probes):
    probes.action("A")
    with pytest.raises(NodeConfigError, match="_skipif"):
        factory.create_tree(wrap('<A _skipif="true"/>'))


def test_nodes_without_conditions_use_the_plain_class(factory, probes):
    probes.action("A")
    tree = factory.create_tree(wrap('<Sequence><A/><A name="B" _skipIf="false"/></Sequence>'))
    plain, guarded = tree.root.children
    assert getattr(type(guarded), "_guarded", False) and not getattr(type(plain), "_guarded", False)
