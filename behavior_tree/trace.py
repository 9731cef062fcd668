"""Tick traces: each node's status transitions, tick by tick, for debugging and replays.

``trace = tree.enable_trace()`` switches every node of that tree to a traced
subclass (nothing is traced, and nothing costs, until then). Each tick adds a
:class:`TickRecord` listing the transitions in the order they happened: the
status a node returned (``RUNNING -> FAILURE``) and, at the end of the tick,
the resets done by parents (``FAILURE -> IDLE``).
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from .node import TreeNode, iter_nodes
from .status import IDLE, SKIPPED, Status

if TYPE_CHECKING:
    from .tree import Tree

__all__ = ["TickRecord", "TickTrace", "Transition"]


class Transition(NamedTuple):
    uid: int
    name: str
    old: Status
    new: Status

    def __str__(self) -> str:
        return f"{self.name}#{self.uid}: {self.old.name} -> {self.new.name}"


@dataclass
class TickRecord:
    tick: int
    time: float
    status: Status
    transitions: list[Transition]
    halted: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "tick": self.tick,
            "time": self.time,
            "status": self.status.name,
            "halted": self.halted,
            "transitions": [[t.uid, t.name, t.old.name, t.new.name] for t in self.transitions],
        }


_TRACED: dict[type, type] = {}


def _traced_class(cls: type[TreeNode]) -> type[TreeNode]:
    t = _TRACED.get(cls)
    if t is not None:
        return t
    base_tick = cls.tick

    def tick(self: TreeNode) -> Status:
        before = self.status
        r = base_tick(self)
        trace = self.tree._trace
        if trace is not None:
            trace._note(self, before, r)
        return r

    t = type(cls.__name__, (cls,), {"__slots__": (), "tick": tick,
                                     "__module__": cls.__module__, "_traced_base": cls})
    _TRACED[cls] = t
    return t


class TickTrace:
    """The recorded ticks of one tree (``records``, oldest first, at most ``max_ticks``)."""

    def __init__(self, tree: Tree, max_ticks: int | None = 1000) -> None:
        self.tree = tree
        self.records: deque[TickRecord] = deque(maxlen=max_ticks)
        self._pending: list[Transition] = []
        self._last: dict[int, Status] = {}
        for n in iter_nodes(tree.root):
            self._last[n.spec.uid] = n.status
            if not hasattr(type(n), "_traced_base"):
                n.__class__ = _traced_class(type(n))

    def close(self) -> None:
        """Stop tracing and give the nodes back their plain classes."""
        for n in iter_nodes(self.tree.root):
            base = getattr(type(n), "_traced_base", None)
            if base is not None:
                n.__class__ = base
        if self.tree._trace is self:
            self.tree._trace = None

    def _note(self, node: TreeNode, before: Status, returned: Status) -> None:
        uid = node.spec.uid
        new = returned if returned is not SKIPPED else SKIPPED
        if new is not before:
            self._pending.append(Transition(uid, node.spec.name, before, new))
            self._last[uid] = IDLE if new is SKIPPED else new

    def record(self, tree: Tree, halted: bool = False) -> None:
        transitions = self._pending
        self._pending = []
        last = self._last
        for n in iter_nodes(tree.root):
            uid = n.spec.uid
            if last.get(uid) is not n.status:
                transitions.append(Transition(uid, n.spec.name, last.get(uid, IDLE), n.status))
                last[uid] = n.status
        self.records.append(
            TickRecord(tree.tick_count, tree.clock(), tree.root.status, transitions, halted)
        )

    def as_list(self) -> list[dict[str, Any]]:
        return [r.as_dict() for r in self.records]

    def to_json(self) -> str:
        return json.dumps(self.as_list())

    def format(self) -> str:
        """Human-readable: one block per tick."""
        lines = []
        for r in self.records:
            head = f"tick {r.tick} ({'halt' if r.halted else r.status.name}) t={r.time:.3f}"
            lines.append(head)
            lines.extend(f"  {t}" for t in r.transitions)
        return "\n".join(lines)
