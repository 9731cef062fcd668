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
# optional pre-condition on a node: none, or one of these reading a key flipped every tick
guards = st.sampled_from([None, "_skipIf", "_while", "_successIf", "_failureIf"])


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


trees = st.recursive(leaves, _nodes, max_leaves=10).flatmap(
    lambda shape: st.tuples(st.just(shape), st.lists(guards, min_size=30, max_size=30)))


def _build(shape: Any, counter: itertools.count, guard_of: list[str | None]) -> b.BNode:
    kind = shape[0]
    i = next(counter)
    guard = guard_of[i % len(guard_of)]
    attrs: dict[str, Any] = {guard: f"flag{i % 3}"} if guard else {}
    if kind == "leaf":
        _, seq, stateful = shape
        name = f"L{i}"
        cycle = itertools.cycle(seq)
        if stateful:
            cls = type(name, (StatefulAction,), {
                "on_start": lambda self: next(cycle), "on_running": lambda self: next(cycle)})
            return b.action(cls, name=name, **attrs)
        return b.action(lambda ctx: next(cycle), name=name, **attrs)
    kids = [_build(c, counter, guard_of) for c in shape[1]]
    extra = {"Repeat": {"num_cycles": 2}, "Retry": {"num_attempts": 2},
             "Timeout": {"msec": 150}, "Delay": {"delay_msec": 100}, "Cooldown": {"msec": 200}}
    tag = "RetryUntilSuccessful" if kind == "Retry" else kind
    return b.node(tag, *kids, **extra.get(kind, {}), **attrs)


def _check_running_only_on_active_path(tree: Any) -> None:
    for node, _ in tree.walk():
        running = [c for c in node.children if c.status is R]
        if node.status is not R:
            assert not running, f"{running} RUNNING under non-running {node!r}"
        elif node.id not in ("Parallel", "ParallelAll"):
            assert len(running) <= 1, f"{node!r} has several RUNNING children: {running}"


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(tree_and_guards=trees, n_ticks=st.integers(1, 12), halt_at=st.integers(0, 12),
       flags=st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans()),
                      min_size=12, max_size=12))
def test_random_trees_keep_running_on_the_active_path_and_halt_to_idle(
        tree_and_guards, n_ticks, halt_at, flags):
    shape, guard_of = tree_and_guards
    try:
        definition = b.define(_build(shape, itertools.count(), guard_of), factory=Factory())
    except NodeConfigError as e:
        assume("asynchronous" not in str(e))
        raise
    clock = FakeClock()
    tree = definition.instantiate(clock=clock)
    for i in range(n_ticks):
        for k, flag in enumerate(flags[i]):
            tree.blackboard.set(f"flag{k}", flag)
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


def _registered(shape: Any, counter: itertools.count, guard_of: list[str | None]) -> b.BNode:
    """The same random shapes, with registered leaves, so the XML can be loaded again."""
    kind = shape[0]
    i = next(counter)
    guard = guard_of[i % len(guard_of)]
    attrs: dict[str, Any] = {guard: f"flag{i % 3} && x < {i}"} if guard else {}
    if kind == "leaf":
        return b.action("Stateful" if shape[2] else "Leaf", name=f"L{i}", **attrs)
    kids = [_registered(c, counter, guard_of) for c in shape[1]]
    extra = {"Repeat": {"num_cycles": 2}, "Retry": {"num_attempts": 3},
             "Timeout": {"msec": 150.5}, "Delay": {"delay_msec": 100}, "Cooldown": {"msec": 200},
             "RunOnce": {"then_skip": False}, "Parallel": {"success_count": -1}}
    tag = "RetryUntilSuccessful" if kind == "Retry" else kind
    return b.node(tag, *kids, **extra.get(kind, {}), **attrs)


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(tree_and_guards=trees)
def test_random_definitions_survive_the_xml_round_trip(tree_and_guards):
    shape, guard_of = tree_and_guards
    factory = Factory()
    factory.register_action("Leaf", lambda ctx: True)

    class Stateful(StatefulAction):
        def on_start(self):
            return R

        def on_running(self):
            return S

    factory.register_action("Stateful", Stateful)
    try:
        built = factory.define(_registered(shape, itertools.count(), guard_of))
    except NodeConfigError as e:
        assume("asynchronous" not in str(e))
        raise
    text = built.to_xml()
    loaded = factory.load(text)
    assert loaded == built
    assert loaded.to_xml() == text
