"""Reactive controls over several asynchronous children, AsyncSequence and AsyncFallback.

Narratives of BT.CPP 4.10's behaviour (checked against BT.CPP built from source, same
trees, same scripted leaves): a reactive node accepts any number of asynchronous
children, and a child that starts RUNNING halts the one that was running.
"""

from __future__ import annotations

import pytest

from behavior_tree import NodeConfigError, Status

from .conftest import statuses, wrap

R, S, F = Status.RUNNING, Status.SUCCESS, Status.FAILURE

PRIORITY_SELECTOR = wrap(
    "<ReactiveFallback>"
    "<Sequence name='flee'><EnemyNear/><Flee/></Sequence>"
    "<Sequence name='eat'><Hungry/><Eat/></Sequence>"
    "<Wander/>"
    "</ReactiveFallback>"
)


def test_priority_selector_with_an_async_action_in_every_branch_loads(factory, probes):
    probes.condition("EnemyNear", "Hungry")
    probes.stateful("Flee", "Eat", "Wander")
    tree = factory.create_tree(PRIORITY_SELECTOR)
    assert tree.definition.root.id == "ReactiveFallback"


def test_a_higher_priority_branch_that_starts_running_halts_the_lower_one(factory, probes):
    probes.condition("EnemyNear", "Hungry")
    probes.stateful("Flee", "Eat", "Wander")
    tree = factory.create_tree(PRIORITY_SELECTOR)
    probes.set(EnemyNear=False, Hungry=False, Flee=R, Eat=R, Wander=R)

    assert tree.tick() is R  # nothing to do: wander
    assert probes.log == ["EnemyNear", "Hungry", "Wander"]

    probes.reset_counts()
    probes.set(Hungry=True)
    assert tree.tick() is R  # hungry now: eating starts, wandering is halted after it
    assert probes.log == ["EnemyNear", "Hungry", "Eat", "halt Wander"]
    assert statuses(tree)["Wander"] == "IDLE" and statuses(tree)["Eat"] == "RUNNING"

    probes.reset_counts()
    assert tree.tick() is R  # still hungry: the conditions are re-checked, Eat continues
    assert probes.log == ["EnemyNear", "Eat"]  # the Sequence resumes at its running child

    probes.reset_counts()
    probes.set(EnemyNear=True)
    assert tree.tick() is R  # danger: fleeing takes over, eating is interrupted
    assert probes.log == ["EnemyNear", "Flee", "halt Eat"]
    assert probes.halts == {"Eat": 1}


@pytest.fixture
def walk_then_talk(factory, probes):
    """A reactive sequence with a condition and two asynchronous actions."""
    probes.condition("Ok")
    probes.stateful("Walk", "Talk")
    return factory.create_tree(wrap("<ReactiveSequence><Ok/><Walk/><Talk/></ReactiveSequence>"))


def test_reactive_sequence_restarts_an_earlier_async_child_that_completed(walk_then_talk,
                                                                          probes):
    # BT.CPP: when Talk starts, Walk (which succeeded) is reset; next tick Walk starts
    # again and Talk is halted. Two async actions in a reactive sequence take turns.
    tree = walk_then_talk
    probes.set(Ok=True, Walk=R, Talk=R)
    assert tree.tick() is R
    probes.set(Walk=S)
    probes.reset_counts()
    assert tree.tick() is R
    assert probes.log == ["Ok", "Walk", "Talk"] and probes.starts == {"Talk": 1}
    probes.set(Walk=R)
    probes.reset_counts()
    assert tree.tick() is R
    assert probes.log == ["Ok", "Walk", "halt Talk"] and probes.starts == {"Walk": 1}


def test_a_failing_condition_halts_whichever_async_child_runs(walk_then_talk, probes):
    tree = walk_then_talk
    probes.set(Ok=True, Walk=S, Talk=R)
    assert tree.tick() is R
    probes.set(Ok=False)
    assert tree.tick() is F
    assert probes.halts == {"Talk": 1}
    assert set(statuses(tree).values()) == {"IDLE", "FAILURE"}


def test_a_reactive_sequence_refuses_two_async_sequences(factory, probes):
    probes.action("A", "B")
    with pytest.raises(NodeConfigError, match="2 AsyncSequence children") as e:
        factory.create_tree(wrap("<ReactiveSequence><AsyncSequence><A/><B/></AsyncSequence>"
                                 "<AsyncSequence><A/><B/></AsyncSequence></ReactiveSequence>"))
    assert e.value.line == 1 and "ReactiveSequence" in str(e.value)


def test_async_sequence_yields_after_each_child_that_finished_in_one_tick(factory, probes):
    probes.condition("Ok")
    probes.action("A", "C")
    probes.stateful("B")
    tree = factory.create_tree(wrap(
        "<ReactiveSequence><Ok/><AsyncSequence><A/><B/><C/></AsyncSequence></ReactiveSequence>"))
    probes.set(Ok=True, B=R)
    assert tree.tick() is R and probes.log == ["Ok", "A"]  # A done: hand back control
    probes.reset_counts()
    assert tree.tick() is R and probes.log == ["Ok", "B"]  # B starts
    probes.set(Ok=False)
    probes.reset_counts()
    assert tree.tick() is F and probes.log == ["Ok", "halt B"]  # re-checked between steps
    probes.set(Ok=True, B=S)
    probes.reset_counts()
    assert tree.tick() is R and probes.log == ["Ok", "A"]  # starts over
    probes.reset_counts()
    assert tree.tick() is R and probes.log == ["Ok", "B"]  # B was idle: yields after it
    probes.reset_counts()
    assert tree.tick() is S and probes.log == ["Ok", "C"]


def test_async_sequence_goes_on_in_the_same_tick_after_a_child_that_was_running(
        factory, probes):
    probes.action("A", "C")
    probes.stateful("B")
    tree = factory.create_tree(wrap("<AsyncSequence><A/><B/><C/></AsyncSequence>"))
    probes.set(B=R)
    assert tree.tick() is R
    assert tree.tick() is R  # B starts
    probes.set(B=S)
    probes.reset_counts()
    assert tree.tick() is S and probes.log == ["B", "C"]


def test_async_fallback_tries_one_child_per_tick(factory, probes):
    probes.action("A", "B", "C")
    tree = factory.create_tree(wrap("<AsyncFallback><A/><B/><C/></AsyncFallback>"))
    probes.set(A=F, B=F, C=S)
    assert [tree.tick() for _ in range(4)] == [R, R, S, R]
    assert probes.log == ["A", "B", "C", "A"]
