"""Shared helpers: a fake clock and scriptable probe leaves that record ticks and halts."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from behavior_tree import Factory, Status, Tree


class FakeClock:
    """A clock tests advance by hand (seconds)."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class Probes:
    """Leaves whose results the test sets by name; every tick, start and halt is counted.

    ``action(name)``/``condition(name)`` register plain-function leaves (synchronous);
    ``stateful(name)`` registers a StatefulAction (asynchronous: it can observe halts).
    """

    def __init__(self, factory: Factory) -> None:
        self.factory = factory
        self.result: dict[str, Any] = {}
        self.ticks: Counter[str] = Counter()
        self.starts: Counter[str] = Counter()
        self.halts: Counter[str] = Counter()
        self.log: list[str] = []

    def set(self, **results: Status | bool) -> None:
        self.result.update(results)

    def action(self, *names: str) -> None:
        for name in names:
            self.factory.register_action(name, self._fn(name))

    def condition(self, *names: str) -> None:
        for name in names:
            self.factory.register_condition(name, self._fn(name))

    def stateful(self, *names: str) -> None:
        for name in names:
            def start(ctx: Any, name: str = name) -> Any:
                self.starts[name] += 1
                return self._fn(name)(ctx)

            def halted(ctx: Any, name: str = name) -> None:
                self.halts[name] += 1
                self.log.append(f"halt {name}")

            self.factory.register_stateful_action(name, start, self._fn(name), halted)

    def _fn(self, name: str) -> Any:
        def fn(ctx: Any) -> Any:
            self.ticks[name] += 1
            self.log.append(name)
            return self.result.get(name, Status.SUCCESS)

        return fn

    def reset_counts(self) -> None:
        self.ticks.clear()
        self.starts.clear()
        self.halts.clear()
        self.log.clear()


def wrap(body: str, *extra_trees: str) -> str:
    """One main tree (plus extra <BehaviorTree> blocks) in a BT.CPP v4 document."""
    return (
        '<root BTCPP_format="4" main_tree_to_execute="Main">'
        f'<BehaviorTree ID="Main">{body}</BehaviorTree>{"".join(extra_trees)}</root>'
    )


def statuses(tree: Tree) -> dict[str, str]:
    """name -> status name, for nodes with unique names."""
    return {n.name: n.status.name for n in tree.nodes()}


@pytest.fixture
def factory() -> Factory:
    return Factory()


@pytest.fixture
def probes(factory: Factory) -> Probes:
    return Probes(factory)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
