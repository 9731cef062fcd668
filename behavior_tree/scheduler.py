"""Ticking many trees: per-tree tick rate, random phase, and event-driven sleep.

    scheduler = TreeScheduler(seed=7)
    for npc in npcs:
        scheduler.add(npc.tree, rate_hz=10)
    # every frame:
    scheduler.update(now)

Each tree ticks on its own grid ``phase + k / rate_hz``; phases are drawn from
a seeded RNG so 10,000 trees at 10 Hz spread evenly over the 100 ms period
instead of all ticking on the same frame. A tree that falls asleep (see
:class:`~behavior_tree.tree.Tree`) leaves the grid until a blackboard key it
read changes or its wake deadline passes; it then resumes at its next grid
slot. Trees added here get ``track_reads`` switched on.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Iterator

from .status import Status
from .tree import Tree

__all__ = ["TreeScheduler"]

_EPS = 1e-9


class _Entry:
    __slots__ = ("active", "epoch", "period", "phase", "tree")

    def __init__(self, tree: Tree, period: float, phase: float) -> None:
        self.tree = tree
        self.period = period
        self.phase = phase
        self.active = True
        self.epoch = 0  # bumped by set_rate: older grid slots in the heap are stale

    def next_slot(self, t: float) -> float:
        """The first grid time >= t (computed from the grid, so no drift accumulates)."""
        k = math.ceil((t - self.phase) / self.period - 1e-9)
        return self.phase + k * self.period


class TreeScheduler:
    """Holds trees and ticks only the due, awake ones on :meth:`update`.

    ``on_tick(tree, status)``, if given, is called after every tick. With
    ``sleep=False`` trees tick on every slot whatever they are doing.
    """

    def __init__(self, *, rate_hz: float = 10.0, seed: int | None = 0,
                 on_tick: Callable[[Tree, Status], None] | None = None,
                 sleep: bool = True) -> None:
        if rate_hz <= 0:
            raise ValueError("rate_hz must be positive")
        self.rate_hz = rate_hz
        self._rng = random.Random(seed)
        self._entries: dict[Tree, _Entry] = {}
        self._due: list[tuple[float, int, _Entry, int]] = []  # heap of (slot, seq, entry, epoch)
        self._timers: list[tuple[float, int, _Entry]] = []  # heap of sleep deadlines
        self._seq = 0
        self._now = -math.inf
        self.on_tick = on_tick
        self.use_sleep = sleep
        self.ticks = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, tree: object) -> bool:
        return tree in self._entries

    def trees(self) -> Iterator[Tree]:
        return iter(self._entries)

    def add(self, tree: Tree, *, rate_hz: float | None = None, phase: float | None = None,
            start: float = 0.0) -> None:
        """Schedule ``tree`` at ``rate_hz`` (default: the scheduler's) from ``start``.

        ``phase`` in [0, 1) of a period; random (seeded) if None.
        """
        if tree in self._entries:
            raise ValueError("tree already scheduled")
        rate = self.rate_hz if rate_hz is None else rate_hz
        if rate <= 0:
            raise ValueError("rate_hz must be positive")
        period = 1.0 / rate
        frac = self._rng.random() if phase is None else phase
        if not 0.0 <= frac < 1.0:
            raise ValueError("phase must be in [0, 1)")
        e = _Entry(tree, period, start + frac * period)
        self._entries[tree] = e
        if self.use_sleep:
            tree.track_reads = True
            tree._on_wake = self._woken
        self._push(e, e.next_slot(max(start, self._now)))

    def remove(self, tree: Tree) -> None:
        e = self._entries.pop(tree, None)
        if e is not None:
            e.active = False
            if self.use_sleep:
                tree._on_wake = None
                tree.track_reads = False

    def _push(self, e: _Entry, t: float) -> None:
        self._seq += 1
        heapq.heappush(self._due, (t, self._seq, e, e.epoch))

    def set_rate(self, tree: Tree, rate_hz: float) -> None:
        """Change a scheduled tree's tick rate (e.g. slower for NPCs far from the player).

        The tree keeps its phase offset; its next tick is the new grid's next slot.
        """
        if rate_hz <= 0:
            raise ValueError("rate_hz must be positive")
        e = self._entries[tree]
        e.period = 1.0 / rate_hz
        e.epoch += 1
        if e.active:
            now = self._now if self._now > -math.inf else e.phase
            self._push(e, e.next_slot(now + e.period * 1e-6))

    def _woken(self, tree: Tree) -> None:
        e = self._entries.get(tree)
        if e is not None and not e.active:
            e.active = True
            self._push(e, e.next_slot(self._now))

    @property
    def sleeping(self) -> int:
        """How many trees are asleep (off the grid)."""
        return sum(1 for e in self._entries.values() if not e.active)

    def update(self, now: float) -> int:
        """Tick every awake tree whose slot is <= ``now`` (once each); return the count."""
        self._now = now
        horizon = now + _EPS  # float slack: a slot computed as 1.0000000000000002 is due at 1.0
        timers = self._timers
        while timers and timers[0][0] <= horizon:
            deadline, _, e = heapq.heappop(timers)
            # A timer from a sleep that a key change already cut short is stale: the tree may
            # be asleep again with a later deadline, and waking it here would leave it marked
            # awake but off the grid until that later deadline.
            if deadline != e.tree.wake_deadline:
                continue
            if not e.active and e.tree in self._entries and e.tree.asleep:
                e.tree.asleep = False
                e.active = True
                self._push(e, e.next_slot(e.tree.wake_deadline))
        due = self._due
        ticked = 0
        on_tick = self.on_tick
        while due and due[0][0] <= horizon:
            slot, _, e, epoch = heapq.heappop(due)
            if not e.active or epoch != e.epoch:
                continue
            tree = e.tree
            st = tree.tick()
            ticked += 1
            if on_tick is not None:
                on_tick(tree, st)
            if tree.asleep and self.use_sleep:
                e.active = False
                if tree.wake_deadline < math.inf:
                    self._seq += 1
                    heapq.heappush(timers, (tree.wake_deadline, self._seq, e))
            else:
                # the next grid slot after this one, or after now if we fell behind (never
                # tick a tree twice in one update)
                self._push(e, e.next_slot(max(slot, now) + 0.5 * e.period))
        self.ticks += ticked
        return ticked
