"""Property tests over random trees: halting leaves everything IDLE, and RUNNING
never survives outside the active path."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from behavior_tree import Factory, NodeConfigError, StatefulAction, Status
from behavior_tree import builder as b

from .conftest import FakeClock

R, S, F = Status.RUNNING, Status.SUCCESS, Status.FAILURE
results = st.lists(st.sampled_from([S, F, R]), min_size=1, max_size=4)

leaves = st.tuples(st.just("leaf"), results, st.booleans())


def _nodes(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    many = st.lists(children, min_size=1, max_size=4)
    two_three = st.lists(children, min_size=2, max_size=3)
    controls = st.tuples(
        st.sampled_from(["Sequence", "SequenceWithMemory", "ReactiveSequence", "Fallback",
                         "ReactiveFallback", "Parallel", "ParallelAll"]), many)
    branching = st.tuples(st.sampled_from(["IfThenElse", "WhileDoElse"]), two_three)
    decorators = st.tuples(
        st.sampled_from(["Inverter", "ForceSuccess", "ForceFailure", "Repeat", "Retry",
                         "KeepRunningUntilFailure", "Timeout", "Delay", "RunOnce", "Cooldown"]),
        children.map(lambda c: [c]))
    return st.one_of(controls, branching, decorators)


trees = st.recursive(leaves, _nodes, max_leaves=10)


def _build(shape: Any, counter: itertools.count) -> b.BNode:
    kind = shape[0]
    if kind == "leaf":
        _, seq, stateful = shape
        name = f"L{next(counter)}"
        cycle = itertools.cycle(seq)
        if stateful:
            cls = type(name, (StatefulAction,), {
                "on_start": lambda self: next(cycle), "on_running": lambda self: next(cycle)})
            return b.action(cls, name=name)
        return b.action(lambda ctx: next(cycle), name=name)
    kids = [_build(c, counter) for c in shape[1]]
    extra = {"Repeat": {"num_cycles": 2}, "Retry": {"num_attempts": 2},
             "Timeout": {"msec": 150}, "Delay": {"delay_msec": 100}, "Cooldown": {"msec": 200}}
    tag = "RetryUntilSuccessful" if kind == "Retry" else kind
    return b.node(tag, *kids, **extra.get(kind, {}))


def _check_running_only_on_active_path(tree: Any) -> None:
    for node, _ in tree.walk():
        if node.status is not R:
            for child in node.children:
                assert child.status is not R, f"{child!r} RUNNING under non-running {node!r}"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=trees, n_ticks=st.integers(1, 12), halt_at=st.integers(0, 12))
def test_random_trees_keep_running_on_the_active_path_and_halt_to_idle(shape, n_ticks, halt_at):
    try:
        definition = b.define(_build(shape, itertools.count()), factory=Factory())
    except NodeConfigError as e:
        assume("asynchronous" not in str(e))
        raise
    clock = FakeClock()
    tree = definition.instantiate(clock=clock)
    for i in range(n_ticks):
        status = tree.tick()
        assert status in (R, S, F, Status.SKIPPED)
        assert tree.errors == []
        _check_running_only_on_active_path(tree)
        if status is not R:
            assert all(n.status is not R for n in tree.nodes())
        if i == halt_at:
            tree.halt()
            assert all(n.status is Status.IDLE for n in tree.nodes())
        clock.advance(0.06)
    tree.halt()
    assert all(n.status is Status.IDLE for n in tree.nodes())
