"""A running tree: one per NPC, built by ``TreeDefinition.instantiate``."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .blackboard import Blackboard
from .node import TreeNode, iter_nodes
from .status import IDLE, RUNNING, Status

if TYPE_CHECKING:
    from .definition import TreeDefinition
    from .trace import TickTrace

__all__ = ["NodeError", "Tree"]

_INF = math.inf


@dataclass(frozen=True)
class NodeError:
    """An exception raised by a user callback (or script), recorded on the tree."""

    tick: int
    node_name: str
    node_id: str
    exception: BaseException

    def __str__(self) -> str:
        return f"tick {self.tick}: node {self.node_name!r} ({self.node_id}): {self.exception!r}"


class _ReadLog:
    """Blackboard entries read during one tick, and whether one of them was written."""

    __slots__ = ("dirty", "entries")

    def __init__(self) -> None:
        self.entries: set[Any] = set()
        self.dirty = False


class Tree:
    """One NPC's tree: ``tick()`` runs exactly one tick of the root, ``halt()``
    interrupts everything (all nodes IDLE afterwards).

    * ``blackboard`` is the root blackboard.
    * ``errors`` lists exceptions raised by user callbacks; the node that raised
      returns FAILURE (``raise_errors=True`` re-raises instead). ``max_errors``
      bounds the list (oldest dropped).
    * ``clock`` (default ``time.monotonic``) times Timeout/Delay/Cooldown/sleep.
    * ``user_data`` is free for the caller (e.g. the NPC owning the tree); trees can be
      weakly referenced.
    * Sleep: when every RUNNING leaf asked to sleep (``ctx.sleep()``), the tree
      is ``asleep`` after the tick until a blackboard key read during that tick
      changes (needs ``track_reads``) or ``wake_deadline`` passes (see
      :meth:`is_due`). ``tick()`` still ticks a sleeping tree if called.
      Conditions on time (``ctx.now()``) do not wake a tree: bound such sleeps
      with ``ctx.sleep(seconds)`` or a timer node (Delay, Timeout, Cooldown, Sleep).
    """

    __slots__ = (
        "__weakref__",
        "_blackboards",
        "_extra",
        "_on_wake",
        "_reads",
        "_sleepers",
        "_timer",
        "_trace",
        "asleep",
        "blackboard",
        "clock",
        "definition",
        "errors",
        "max_errors",
        "raise_errors",
        "root",
        "tick_count",
        "user_data",
        "wake_deadline",
    )

    def _init(self, definition: TreeDefinition, root: TreeNode, bb: Blackboard,
              blackboards: list[Blackboard], clock: Callable[[], float] | None,
              raise_errors: bool) -> None:
        self.definition = definition
        self.root = root
        self.blackboard = bb
        self._blackboards = blackboards
        self.clock = time.monotonic if clock is None else clock
        self.raise_errors = raise_errors
        self.errors: list[NodeError] = []
        self.max_errors = 100
        self.tick_count = 0
        self._sleepers: dict[TreeNode, float] | None = None
        self._timer = _INF
        self._reads: _ReadLog | None = None
        self._trace: TickTrace | None = None
        self._on_wake: Callable[[Tree], None] | None = None
        self._extra = False
        self.user_data: Any = None  # free for the game (e.g. the NPC that owns the tree)
        self.asleep = False
        self.wake_deadline = _INF

    # ---- ticking -------------------------------------------------------------------
    def tick(self) -> Status:
        """Tick the root exactly once and return its status."""
        self.tick_count += 1
        st = self.root.tick()
        if self._extra:  # sleep, timers, read tracking or tracing in use
            self._after_tick(st)
        return st

    def halt(self) -> None:
        """Halt every RUNNING node; afterwards every node is IDLE."""
        root = self.root
        if root.status is RUNNING:
            root.halt()
        for n in iter_nodes(root):  # completed nodes keep their last status until reset
            n.status = IDLE
        self._sleepers = None
        self.wake()  # a halted tree starts over on its next tick
        if self._trace is not None:
            self._trace.record(self, halted=True)

    @property
    def status(self) -> Status:
        return self.root.status

    # ---- errors --------------------------------------------------------------------
    def _callback_error(self, node: TreeNode, exc: BaseException) -> Status:
        if self.raise_errors:
            raise exc
        errors = self.errors
        errors.append(NodeError(self.tick_count, node.spec.name, node.spec.id, exc))
        if len(errors) > self.max_errors:
            del errors[0]
        from .status import FAILURE

        return FAILURE

    # ---- sleep ---------------------------------------------------------------------
    @property
    def track_reads(self) -> bool:
        """Record blackboard reads during ticks so a sleeping tree wakes when they change."""
        return self._reads is not None

    @track_reads.setter
    def track_reads(self, on: bool) -> None:
        log = _ReadLog() if on else None
        self._reads = log
        for bb in self._blackboards:
            bb._reads = log  # type: ignore[assignment]
        self._extra = True

    def _request_sleep(self, node: TreeNode, seconds: float | None) -> None:
        if self._sleepers is None:
            self._sleepers = {}
        self._sleepers[node] = _INF if seconds is None else self.clock() + seconds
        self._extra = True

    def wake_at(self, t: float) -> None:
        """During a tick: the tree must not sleep past ``t`` (a node's timer)."""
        if t < self._timer:
            self._timer = t
            self._extra = True

    def _after_tick(self, st: Status) -> None:
        was_asleep = self.asleep
        self.asleep = False
        if self._sleepers is not None or self._reads is not None:
            self._settle_sleep(st)
        self._timer = _INF
        if self._trace is not None:
            self._trace.record(self)
        self._extra = self._reads is not None or self._trace is not None or self.asleep
        if was_asleep and not self.asleep and self._on_wake is not None:
            self._on_wake(self)  # ticked by hand while asleep: back on the scheduler's grid

    def _settle_sleep(self, st: Status) -> None:
        sleepers = self._sleepers
        self._sleepers = None
        reads = self._reads
        asleep = False
        deadline = self._timer
        if sleepers is not None and st is RUNNING and (reads is None or not reads.dirty):
            t = _sleep_deadline(self.root, sleepers)
            if t is not None:
                asleep = True
                if t < deadline:
                    deadline = t
        if asleep:
            self.asleep = True
            self.wake_deadline = deadline
            if reads is not None:
                for e in reads.entries:
                    w = e.waiters
                    if w is None:
                        e.waiters = {self}
                    else:
                        w.add(self)
        if reads is not None:
            reads.entries.clear()
            reads.dirty = False

    def wake(self) -> None:
        """End a sleep now (called when a key it read changes, or by async actions)."""
        if self.asleep:
            self.asleep = False
            if self._on_wake is not None:
                self._on_wake(self)

    def is_due(self, now: float) -> bool:
        """False while asleep and ``now`` is before the wake deadline."""
        return not self.asleep or now >= self.wake_deadline

    # ---- saving ----------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """JSON-compatible copy of every blackboard of this tree (the root's and each
        SubTree's, in instantiation order). Node progress is not saved: a restored
        tree starts from IDLE, its blackboards as they were."""
        return {"version": 1, "blackboards": [bb.snapshot() for bb in self._blackboards]}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Load a :meth:`snapshot` taken from a tree of the same definition (halts first)."""
        boards = snapshot.get("blackboards") if snapshot.get("version") == 1 else None
        if not isinstance(boards, list) or len(boards) != len(self._blackboards):
            raise ValueError(
                f"not a snapshot of this tree (expected version 1 with "
                f"{len(self._blackboards)} blackboards)")
        self.halt()
        for bb, snap in zip(self._blackboards, boards):
            bb.restore(snap)

    # ---- inspection ----------------------------------------------------------------
    def nodes(self) -> Iterator[TreeNode]:
        """Every node, depth-first, parents first (``node.name``, ``.id``, ``.status``,
        ``.children``, ``.port_bindings()``, ``.uid``)."""
        return iter_nodes(self.root)

    def walk(self) -> Iterator[tuple[TreeNode, int]]:
        """(node, depth) pairs, depth-first."""
        stack = [(self.root, 0)]
        while stack:
            n, d = stack.pop()
            yield n, d
            stack.extend((c, d + 1) for c in reversed(n.children))

    def statuses(self) -> list[Status]:
        """Each node's status, indexed by ``node.uid``."""
        return [n.status for n in iter_nodes(self.root)]

    def find(self, name: str) -> TreeNode:
        """The first node (depth-first) with this name; KeyError if none."""
        for n in iter_nodes(self.root):
            if n.spec.name == name:
                return n
        raise KeyError(f"no node named {name!r}")

    # ---- tracing -------------------------------------------------------------------
    def enable_trace(self, max_ticks: int | None = 1000) -> TickTrace:
        """Start recording each node's status transitions per tick (see trace.py)."""
        from .trace import TickTrace

        if self._trace is not None:
            self._trace.close()
        self._trace = TickTrace(self, max_ticks)
        self._extra = True
        return self._trace

    def disable_trace(self) -> None:
        if self._trace is not None:
            self._trace.close()

    @property
    def trace(self) -> TickTrace | None:
        return self._trace

    def __repr__(self) -> str:
        return f"<Tree {self.definition.main_tree!r} {self.root.status.name} ticks={self.tick_count}>"


def _sleep_deadline(root: TreeNode, sleepers: dict[TreeNode, float]) -> float | None:
    """The earliest wake time asked by the frontier of the active path (the RUNNING
    nodes with no RUNNING child), or None if one of them did not ask to sleep."""
    deadline = _INF
    stack = [root]
    while stack:
        n = stack.pop()
        t = sleepers.get(n)
        if t is not None:  # it asked to sleep: a leaf, or a waiting Delay/Sleep
            if t < deadline:
                deadline = t
            continue
        found = False
        for c in n.children:
            if c.status is RUNNING:
                stack.append(c)
                found = True
        if not found:
            return None
    return deadline
