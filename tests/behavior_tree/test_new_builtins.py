"""TryCatch, LoopInt/Bool/Double/String, UnsetBlackboard, WasEntryUpdated,
SkipUnlessUpdated and WaitValueUpdate: tick-by-tick narratives of BT.CPP 4.10's
behaviour (each checked against BT.CPP built from source with the same tree)."""

from __future__ import annotations

from collections import deque

import pytest

from behavior_tree import BidirectionalPort, InputPort, NodeConfigError, Status

from .conftest import wrap

R, S, F, K = Status.RUNNING, Status.SUCCESS, Status.FAILURE, Status.SKIPPED


# ---- TryCatch ---------------------------------------------------------------------------

def test_try_catch_succeeds_when_every_try_child_succeeds(factory, probes):
    probes.action("A", "B", "Cleanup")
    tree = factory.create_tree(wrap("<TryCatch><A/><B/><Cleanup/></TryCatch>"))
    assert tree.tick() is S
    assert probes.log == ["A", "B"]


def test_try_catch_runs_the_catch_child_after_a_failure_and_then_fails(factory, probes):
    probes.action("A")
    probes.stateful("B", "Cleanup")
    tree = factory.create_tree(wrap("<TryCatch><A/><B/><Cleanup/></TryCatch>"))
    probes.set(B=R, Cleanup=R)
    assert tree.tick() is R
    probes.set(B=F)
    probes.reset_counts()
    assert tree.tick() is R  # B failed: the catch child starts in the same tick
    assert probes.log == ["B", "Cleanup"]
    probes.set(Cleanup=S)  # whatever the catch child returns, the node fails
    assert tree.tick() is F
    probes.set(B=S)
    probes.reset_counts()
    assert tree.tick() is S  # a fresh start: the try children again
    assert probes.log == ["A", "B"]


def test_try_catch_skipped_when_all_try_children_are_skipped(factory, probes):
    probes.action("A", "Cleanup")
    tree = factory.create_tree(wrap('<TryCatch><A _skipIf="true"/><Cleanup/></TryCatch>'))
    assert tree.tick() is K


def test_try_catch_on_halt_ticks_the_catch_child_once_when_asked(factory, probes):
    probes.condition("Ok")
    probes.stateful("B", "Cleanup")
    tree = factory.create_tree(wrap(
        '<ReactiveSequence><Ok/><TryCatch catch_on_halt="true"><B/><Cleanup/></TryCatch>'
        "</ReactiveSequence>"))
    probes.set(Ok=True, B=R, Cleanup=R)
    assert tree.tick() is R
    probes.set(Ok=False)
    probes.reset_counts()
    assert tree.tick() is F  # halted in the try children: cleanup starts, and is halted
    assert probes.log == ["Ok", "halt B", "Cleanup", "halt Cleanup"]


def test_try_catch_without_catch_on_halt_just_halts(factory, probes):
    probes.condition("Ok")
    probes.stateful("B", "Cleanup")
    tree = factory.create_tree(wrap(
        "<ReactiveSequence><Ok/><TryCatch><B/><Cleanup/></TryCatch></ReactiveSequence>"))
    probes.set(Ok=True, B=R)
    tree.tick()
    probes.set(Ok=False)
    tree.tick()
    assert probes.starts == {"B": 1} and probes.halts == {"B": 1}


def test_try_catch_needs_a_try_and_a_catch_child(factory, probes):
    probes.action("A")
    with pytest.raises(NodeConfigError, match="TryCatch needs at least 2 children"):
        factory.create_tree(wrap("<TryCatch><A/></TryCatch>"))


# ---- loops --------------------------------------------------------------------------------

def seen_values(factory):
    seen = []
    factory.register_action("Use", lambda ctx: seen.append(ctx.get_input("v")) or True,
                            ports=[InputPort("v")])
    return seen


def test_loop_int_runs_the_child_once_per_element_one_per_tick(factory):
    seen = seen_values(factory)
    tree = factory.create_tree(wrap('<LoopInt queue="1;2;3" value="{v}"><Use v="{v}"/></LoopInt>'))
    assert [tree.tick() for _ in range(4)] == [R, R, R, S]  # the 4th tick finds it empty
    assert seen == [1, 2, 3] and tree.blackboard.get("v") == 3


def test_loop_resumes_a_running_child_before_taking_the_next_element(factory, probes):
    probes.stateful("Work")
    probes.action("Done")
    tree = factory.create_tree(wrap(
        '<Sequence><LoopInt queue="1;2" value="{v}"><Work/></LoopInt><Done/></Sequence>'))
    probes.set(Work=R)
    assert tree.tick() is R and tree.blackboard.get("v") == 1
    assert tree.tick() is R and tree.blackboard.get("v") == 1  # still working on 1
    probes.set(Work=S)
    assert tree.tick() is R and tree.blackboard.get("v") == 1  # 1 done
    assert tree.tick() is R and tree.blackboard.get("v") == 2  # 2 done at once
    assert tree.tick() is S and probes.ticks["Done"] == 1
    assert tree.tick() is R and tree.blackboard.get("v") == 1  # restarted by its parent


def test_loop_child_failure_fails_the_loop(factory):
    factory.register_action("Use", lambda ctx: ctx.get_input("v") < 2.0, ports=[InputPort("v")])
    tree = factory.create_tree(wrap(
        '<LoopDouble queue="0.5;2.5;1.0" value="{v}"><Use v="{v}"/></LoopDouble>'))
    assert [tree.tick(), tree.tick()] == [R, F]


@pytest.mark.parametrize(("if_empty", "expected"), [("SUCCESS", S), ("FAILURE", F),
                                                    ("SKIPPED", K)])
def test_an_empty_queue_returns_if_empty(factory, probes, if_empty, expected):
    probes.action("Use")
    tree = factory.create_tree(wrap(
        f'<LoopString queue="" value="{{v}}" if_empty="{if_empty}"><Use/></LoopString>'))
    assert tree.tick() is expected and probes.ticks["Use"] == 0


def test_loop_reads_a_queue_string_from_the_blackboard(factory):
    seen = seen_values(factory)
    tree = factory.create_tree(wrap(
        "<Sequence><Script code=\"q := 'a;b'\"/>"
        '<LoopString queue="{q}" value="{v}"><Use v="{v}"/></LoopString></Sequence>'))
    while tree.tick() is R:
        pass
    assert seen == ["a", "b"] and tree.blackboard.get("q") == "a;b"  # the string stays


def test_loop_pops_a_shared_deque_in_place_and_copies_a_list(factory):
    seen = seen_values(factory)
    xml = wrap('<LoopBool queue="{q}" value="{v}"><Use v="{v}"/></LoopBool>')
    shared: deque[bool] = deque([True, False])
    tree = factory.create_tree(xml)
    tree.blackboard.set("q", shared)
    assert tree.tick() is R and list(shared) == [False]  # the caller sees it shrink
    tree2 = factory.create_tree(xml)
    tree2.blackboard.set("q", ["true", "0"])
    while tree2.tick() is R:
        pass
    assert seen == [True, True, False] and tree2.blackboard.get("q") == ["true", "0"]


# ---- UnsetBlackboard ----------------------------------------------------------------------

def test_unset_blackboard_removes_the_entry(factory, probes):
    probes.action("Check")
    tree = factory.create_tree(wrap(
        '<Sequence><Script code="x := 5"/><UnsetBlackboard key="x"/><Check/></Sequence>'))
    assert tree.tick() is S
    assert "x" not in tree.blackboard and not tree.blackboard.has_entry("x")


def test_assigning_an_unset_key_with_equals_is_an_error_again(factory):
    tree = factory.create_tree(wrap(
        '<Sequence><Script code="x := 5"/><UnsetBlackboard key="x"/><Script code="x = 1"/>'
        "</Sequence>"))
    assert tree.tick() is F and "'x' does not exist" in str(tree.errors[0].exception)


# ---- entry updates ------------------------------------------------------------------------

CHECK = ('<BehaviorTree ID="Check"><Sequence>'
         '<Fallback><WasEntryUpdated entry="A"/><NotUpdated/></Fallback>'
         '<SkipUnlessUpdated entry="A"><Updated/></SkipUnlessUpdated>'
         "</Sequence></BehaviorTree>")


@pytest.mark.parametrize(("body", "not_updated", "updated"), [
    ('<SubTree ID="Check" _autoremap="true"/>', 1, 0),  # A never written
    ('<Sequence><Script code="A := 1"/><SubTree ID="Check" _autoremap="true"/></Sequence>',
     0, 1),
    # written once, checked twice: the second look sees no new write
    ('<Sequence><Script code="A := 1"/><Repeat num_cycles="2">'
     '<SubTree ID="Check" _autoremap="true"/></Repeat></Sequence>', 1, 1),
    # written before each look, with the same value: every write counts
    ('<Repeat num_cycles="2"><Sequence><Script code="A := 1"/>'
     '<SubTree ID="Check" _autoremap="true"/></Sequence></Repeat>', 0, 2),
])
def test_was_entry_updated_and_skip_unless_updated_see_each_write_once(
        factory, probes, body, not_updated, updated):
    probes.action("NotUpdated", "Updated")
    tree = factory.create_tree(wrap(body, CHECK))
    while (st := tree.tick()) is R:  # a Repeat hands back control between cycles
        pass
    assert st is S
    assert (probes.ticks["NotUpdated"], probes.ticks["Updated"]) == (not_updated, updated)


def test_wait_value_update_runs_until_the_entry_is_written(factory, probes):
    probes.action("Got")
    tree = factory.create_tree(wrap('<WaitValueUpdate entry="{B}"><Got/></WaitValueUpdate>'))
    assert tree.tick() is R and tree.tick() is R and probes.ticks["Got"] == 0
    tree.blackboard.set("B", 2)
    assert tree.tick() is S and probes.ticks["Got"] == 1
    assert tree.tick() is R  # the same write is not seen twice


def test_skip_unless_updated_finishes_a_running_child_without_looking_again(factory, probes):
    probes.stateful("Work")
    tree = factory.create_tree(wrap('<SkipUnlessUpdated entry="{A}"><Work/></SkipUnlessUpdated>'))
    tree.blackboard.set("A", 1)
    probes.set(Work=R)
    assert tree.tick() is R and tree.tick() is R  # no new write, but the child runs on
    probes.set(Work=S)
    assert tree.tick() is S and tree.tick() is K


def test_stand_in_ports_are_optional(factory):
    # what the corpus test relies on: optional untyped ports need not be set
    factory.register_action("X", lambda ctx: ctx.get_input("p") is None,
                            ports=[BidirectionalPort("p", default=None)])
    assert factory.create_tree(wrap("<X/>")).tick() is S


def test_loop_over_a_key_without_value_raises_as_bt_cpp_throws(factory, probes):
    from behavior_tree import BlackboardError

    probes.action("Use")
    tree = factory.create_tree(wrap('<LoopInt queue="{q}" value="{v}"><Use/></LoopInt>'))
    with pytest.raises(BlackboardError, match="'q'"):
        tree.tick()
