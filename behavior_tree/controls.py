"""Control nodes, with BehaviorTree.CPP v4 semantics.

Common rule: when a control node completes (SUCCESS or FAILURE) it resets its
children, so every node below a completed node is IDLE; a child that returns
SKIPPED stays IDLE and is passed over.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from .node import ControlNode, TreeNode, halt_children
from .ports import InputPort
from .status import FAILURE, IDLE, RUNNING, SKIPPED, SUCCESS, Status

__all__ = [
    "Fallback",
    "IfThenElse",
    "Parallel",
    "ParallelAll",
    "ReactiveFallback",
    "ReactiveSequence",
    "Sequence",
    "SequenceWithMemory",
    "Switch",
    "WhileDoElse",
]


class Sequence(ControlNode):
    """Ticks children in order while they succeed.

    A RUNNING child makes the sequence RUNNING, and the next tick resumes at
    that child (earlier children are not ticked again, and keep their SUCCESS
    status until the sequence completes). FAILURE resets the sequence: the
    next tick starts from the first child. SUCCESS when all children
    succeeded; SKIPPED if all were skipped.
    """

    __slots__ = ("idx", "skipped")
    initial_state = (("idx", 0), ("skipped", 0))

    def tick(self) -> Status:
        children = self.children
        i = self.idx
        if i == 0 and self.skipped == 0:
            # Fast path: start from the first child (resuming at child 0 is the same).
            for c in children:
                st = c.tick()
                if st is SUCCESS:
                    continue
                if st is FAILURE:
                    if c is children[0]:
                        c.status = IDLE
                    else:
                        for o in children:
                            o.status = IDLE
                    self.status = FAILURE
                    return FAILURE
                if st is RUNNING:
                    if c is not children[0]:
                        self.idx = children.index(c)
                    self.status = RUNNING
                    return RUNNING
                # SKIPPED (the first one): go on below from the next child
                i = children.index(c) + 1
                self.skipped = 1
                break
            else:
                for c in children:
                    c.status = IDLE
                self.status = SUCCESS
                return SUCCESS
        n = len(children)
        while i < n:
            st = children[i].tick()
            if st is SUCCESS:
                i += 1
            elif st is RUNNING:
                self.idx = i
                self.status = RUNNING
                return RUNNING
            elif st is FAILURE:
                for j in range(i + 1):
                    children[j].status = IDLE
                self.idx = 0
                self.skipped = 0
                self.status = FAILURE
                return FAILURE
            else:
                i += 1
                self.skipped += 1
        for c in children:
            c.status = IDLE
        self.idx = 0
        all_skipped = self.skipped == n
        self.skipped = 0
        if all_skipped:
            self.status = IDLE
            return SKIPPED
        self.status = SUCCESS
        return SUCCESS


class SequenceWithMemory(ControlNode):
    """Like Sequence, but a FAILURE does not reset the progress: the next tick retries
    the child that failed, without re-ticking the ones that succeeded.

    As in BT.CPP 4.10, a child that started and succeeded within one tick hands
    control back when more children remain: the node returns RUNNING and the next
    tick goes on with the next child. A child that was RUNNING and now succeeds lets
    the next child run in the same tick.

    Halt: halts the running child and keeps the position (as BT.CPP since 4.4.1).
    """

    __slots__ = ("idx", "skipped")
    initial_state = (("idx", 0), ("skipped", 0))
    # AsyncSequence and AsyncFallback step through their children the same way:
    _continue_on: ClassVar[Status] = SUCCESS  # a child's status that moves on
    _stop: ClassVar[Status] = FAILURE  # a child's status that ends the node with it
    _keeps_position: ClassVar[bool] = True  # after _stop and on halt

    def halt(self) -> None:
        halt_children(self.children)
        if not self._keeps_position:
            self.reset_state()
        self.status = IDLE

    def tick(self) -> Status:
        children = self.children
        n = len(children)
        if self.status is not RUNNING and self.idx == 0:
            self.skipped = 0
        go_on, stop = self._continue_on, self._stop
        while self.idx < n:
            child = children[self.idx]
            was_idle = child.status is IDLE
            st = child.tick()
            if st is go_on:
                self.idx += 1
                if was_idle and self.idx < n:
                    self.status = RUNNING
                    return RUNNING
            elif st is RUNNING:
                self.status = RUNNING
                return RUNNING
            elif st is stop:
                if self._keeps_position:
                    halt_children(children[self.idx :])
                else:
                    halt_children(children)
                    self.idx = 0
                    self.skipped = 0
                self.status = stop
                return stop
            else:
                self.idx += 1
                self.skipped += 1
        halt_children(children)
        self.idx = 0
        if self.skipped == n:
            self.skipped = 0
            self.status = IDLE
            return SKIPPED
        self.skipped = 0
        self.status = go_on
        return go_on


class ReactiveSequence(ControlNode):
    """Ticks every child from the first on every tick.

    FAILURE of any child resets all and fails. When a child is RUNNING, all the
    other children are halted (so a later child that was RUNNING is
    interrupted when an earlier one starts running) and the node is RUNNING.
    Any number of children may be asynchronous, as in BT.CPP 4.10: at most one
    of them is RUNNING after a tick.

    Halt: halts the running child.
    """

    __slots__ = ("running",)
    initial_state = (("running", None),)

    def tick(self) -> Status:
        # Every outcome ends with all children but the running one IDLE (BT.CPP halts or
        # resets them), so a child that completes is set IDLE right away.
        skipped = 0
        for c in self.children:
            st = c.tick()
            if st is SUCCESS:
                c.status = IDLE
            elif st is FAILURE:
                c.status = IDLE
                r = self.running
                if r is not None:
                    _halt_one(r)
                    self.running = None
                self.status = FAILURE
                return FAILURE
            elif st is RUNNING:
                r = self.running
                if r is not c:
                    if r is not None:
                        _halt_one(r)
                    self.running = c
                self.status = RUNNING
                return RUNNING
            else:
                skipped += 1
        r = self.running
        if r is not None:
            _halt_one(r)
            self.running = None
        if skipped == len(self.children):
            self.status = IDLE
            return SKIPPED
        self.status = SUCCESS
        return SUCCESS


class Fallback(ControlNode):
    """Ticks children in order until one does not fail (BT.CPP's Fallback / Selector).

    A RUNNING child is resumed on the next tick (earlier children keep their
    FAILURE status meanwhile); SUCCESS of a child resets and succeeds; FAILURE
    when all children failed.
    """

    __slots__ = ("idx", "skipped")
    initial_state = (("idx", 0), ("skipped", 0))

    def tick(self) -> Status:
        children = self.children
        i = self.idx
        n = len(children)
        while i < n:
            st = children[i].tick()
            if st is FAILURE:
                i += 1
            elif st is RUNNING:
                self.idx = i
                self.status = RUNNING
                return RUNNING
            elif st is SUCCESS:
                for j in range(i + 1):
                    children[j].status = IDLE
                self.idx = 0
                self.skipped = 0
                self.status = SUCCESS
                return SUCCESS
            else:
                i += 1
                self.skipped += 1
        for c in children:
            c.status = IDLE
        self.idx = 0
        all_skipped = self.skipped == n
        self.skipped = 0
        if all_skipped:
            self.status = IDLE
            return SKIPPED
        self.status = FAILURE
        return FAILURE


class ReactiveFallback(ControlNode):
    """Ticks every child from the first on every tick until one does not fail.

    SUCCESS of a child resets all and succeeds. A RUNNING child halts all the
    others (a higher-priority branch that starts running preempts a lower one)
    and the node is RUNNING: the priority selector, with any number of
    asynchronous branches (BT.CPP 4.10).

    Halt: halts the running child.
    """

    __slots__ = ("running",)
    initial_state = (("running", None),)

    def tick(self) -> Status:
        # As in ReactiveSequence, completed children are set IDLE at once.
        skipped = 0
        for c in self.children:
            st = c.tick()
            if st is FAILURE:
                c.status = IDLE
            elif st is RUNNING:
                r = self.running
                if r is not c:
                    if r is not None:
                        _halt_one(r)
                    self.running = c
                self.status = RUNNING
                return RUNNING
            elif st is SUCCESS:
                c.status = IDLE
                r = self.running
                if r is not None:
                    _halt_one(r)
                    self.running = None
                self.status = SUCCESS
                return SUCCESS
            else:
                skipped += 1
        r = self.running
        if r is not None:
            _halt_one(r)
            self.running = None
        if skipped == len(self.children):
            self.status = IDLE
            return SKIPPED
        self.status = FAILURE
        return FAILURE


def _threshold(value: int, n: int) -> int:
    """BT.CPP: a negative count means ``n + value + 1`` (-1 = all children)."""
    return max(n + value + 1, 0) if value < 0 else value


class Parallel(ControlNode):
    """Ticks all children (not yet completed) on each tick.

    SUCCESS once ``success_count`` children succeeded, FAILURE once
    ``failure_count`` failed or success became impossible; the remaining
    RUNNING children are then halted. Negative counts are relative to the
    number of children (-1 = all). Defaults as BT.CPP: success_count=-1,
    failure_count=1. Skipped children count towards success only with a
    negative success_count.
    """

    __slots__ = ("completed", "failures", "successes")
    ports = (
        InputPort("success_count", type=int, default=-1, description="children that must succeed"),
        InputPort("failure_count", type=int, default=1, description="children failing to fail"),
    )

    def reset_state(self) -> None:
        self.completed: set[int] = set()
        self.successes = 0
        self.failures = 0

    def _clear(self) -> None:
        self.completed.clear()
        self.successes = 0
        self.failures = 0

    def tick(self) -> Status:
        children = self.children
        n = len(children)
        success_value = self.get_input("success_count")
        need_success = _threshold(success_value, n)
        need_failure = _threshold(self.get_input("failure_count"), n)
        skipped = 0
        for i, c in enumerate(children):
            if i not in self.completed:
                st = c.tick()
                if st is SUCCESS:
                    self.completed.add(i)
                    self.successes += 1
                elif st is FAILURE:
                    self.completed.add(i)
                    self.failures += 1
                elif st is SKIPPED:
                    skipped += 1
            if self.successes >= need_success or (
                success_value < 0 and self.successes + skipped >= need_success
            ):
                self._clear()
                halt_children(children)
                self.status = SUCCESS
                return SUCCESS
            if n - self.failures < need_success or self.failures == need_failure:
                self._clear()
                halt_children(children)
                self.status = FAILURE
                return FAILURE
        if skipped == n:
            self.status = IDLE
            return SKIPPED
        self.status = RUNNING
        return RUNNING

    @staticmethod
    def check_config(n_children: int, values: dict[str, Any]) -> str | None:
        s = values.get("success_count", -1)
        f = values.get("failure_count", 1)
        if isinstance(s, int) and _threshold(s, n_children) > n_children:
            return f"success_count={s} exceeds the {n_children} children: it can never succeed"
        if isinstance(f, int) and _threshold(f, n_children) > n_children:
            return f"failure_count={f} exceeds the {n_children} children: it can never fail"
        return None


class ParallelAll(ControlNode):
    """Ticks all children until every one completed; then FAILURE if at least
    ``max_failures`` failed (negative: relative to the number of children),
    else SUCCESS."""

    __slots__ = ("completed", "failures")
    ports = (
        InputPort("max_failures", type=int, default=1, description="failures that fail the node"),
    )

    def reset_state(self) -> None:
        self.completed: set[int] = set()
        self.failures = 0

    def tick(self) -> Status:
        children = self.children
        n = len(children)
        threshold = _threshold(self.get_input("max_failures"), n)
        skipped = 0
        for i, c in enumerate(children):
            if i in self.completed:
                continue
            st = c.tick()
            if st is SUCCESS:
                self.completed.add(i)
            elif st is FAILURE:
                self.completed.add(i)
                self.failures += 1
            elif st is SKIPPED:
                skipped += 1
        if skipped == n:
            self.status = IDLE
            return SKIPPED
        if skipped + len(self.completed) >= n:
            halt_children(children)
            result = FAILURE if self.failures >= threshold else SUCCESS
            self.reset_state()
            self.status = result
            return result
        self.status = RUNNING
        return RUNNING


class IfThenElse(ControlNode):
    """``[condition, then, else?]``: the condition is ticked until it completes;
    SUCCESS runs ``then``, FAILURE runs ``else`` (or fails when there are only
    two children). The chosen branch is resumed while RUNNING; the condition is
    not re-evaluated meanwhile."""

    __slots__ = ("branch",)
    min_children = 2
    max_children = 3

    initial_state = (("branch", 0),)

    def tick(self) -> Status:
        children = self.children
        if self.branch == 0:
            cond = children[0].tick()
            if cond is RUNNING:
                self.status = RUNNING
                return RUNNING
            if cond is SUCCESS:
                self.branch = 1
            elif cond is FAILURE:
                if len(children) == 3:
                    self.branch = 2
                else:
                    halt_children(children)
                    self.status = FAILURE
                    return FAILURE
            else:  # skipped condition: skip the node
                self.status = IDLE
                return SKIPPED
        st = children[self.branch].tick()
        if st is RUNNING:
            self.status = RUNNING
            return RUNNING
        halt_children(children)
        self.branch = 0
        if st is SKIPPED:
            self.status = IDLE
            return SKIPPED
        self.status = st
        return st


class WhileDoElse(ControlNode):
    """``[condition, do, else?]``, reactive: the condition is ticked on every tick.
    SUCCESS ticks ``do`` (halting ``else``), FAILURE ticks ``else`` (halting ``do``)
    or fails when there is no ``else``. A RUNNING condition halts whichever
    branch was running (BT.CPP leaves it RUNNING; we keep one RUNNING child)."""

    __slots__ = ()
    min_children = 2
    max_children = 3

    def tick(self) -> Status:
        children = self.children
        cond = children[0].tick()
        if cond is RUNNING:
            for c in children[1:]:
                _halt_one(c)
            self.status = RUNNING
            return RUNNING
        if cond is SUCCESS:
            if len(children) == 3:
                _halt_one(children[2])
            st = children[1].tick()
        elif cond is FAILURE:
            if len(children) == 3:
                _halt_one(children[1])
                st = children[2].tick()
            else:
                st = FAILURE
        else:
            st = SKIPPED
        if st is RUNNING:
            self.status = RUNNING
            return RUNNING
        halt_children(children)
        if st is SKIPPED:
            self.status = IDLE
            return SKIPPED
        self.status = st
        return st


def _halt_one(c: TreeNode) -> None:
    if c.status is RUNNING:
        c.halt()
    c.status = IDLE


_EPS = 1.1920928955078125e-07  # float epsilon, BT.CPP's tolerance for equal reals


def _switch_text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, Status):
        return v.name
    return v if isinstance(v, str) else str(v)


def _switch_number(v: Any, enums: Mapping[str, Any]) -> float | None:
    if isinstance(v, (bool, int, float)) and not isinstance(v, Status):
        return float(v)
    if not isinstance(v, str):
        return None
    n = enums.get(v)
    if n is not None:
        return float(n)
    if v in ("true", "false"):
        return 1.0 if v == "true" else 0.0
    try:
        return float(int(v))
    except ValueError:
        try:
            return float(v)
        except ValueError:
            return None


def values_equal(variable: Any, case: Any, enums: Mapping[str, Any] | None = None) -> bool:
    """Switch's comparison, BT.CPP's CheckStringEquality: equal as text, or both read as
    numbers (a number text, an enum name, true/false, or a number value) and equal
    within float epsilon. So ``'5.0'`` matches case ``"5"``, ``RED`` matches ``"1"``
    when the enum RED is 1, and the Status SUCCESS matches ``"SUCCESS"``."""
    if _switch_text(variable) == _switch_text(case):
        return True
    enums = enums or {}
    a, b = _switch_number(variable, enums), _switch_number(case, enums)
    return a is not None and b is not None and abs(a - b) <= _EPS


class Switch(ControlNode):
    """``Switch<N>``: ``variable`` is compared with ``case_1`` .. ``case_N``; the
    child of the first match is ticked, the last child is the default. If the
    match changes while a child is RUNNING, that child is halted."""

    __slots__ = ("running",)
    min_children = 2
    ports = (InputPort("variable", description="value compared with the cases"),)
    initial_state = (("running", -1),)

    def tick(self) -> Status:
        children = self.children
        n_cases = len(children) - 1
        match = n_cases
        variable = self.get_input("variable", None)
        if variable is not None:
            for i in range(n_cases):
                case = self.get_input(f"case_{i + 1}", None)
                if case is not None and values_equal(variable, case, self.spec.enums):
                    match = i
                    break
        if self.running != -1 and self.running != match:
            _halt_one(children[self.running])
        st = children[match].tick()
        if st is SKIPPED:
            self.running = -1
            self.status = IDLE
            return SKIPPED
        if st is RUNNING:
            self.running = match
            self.status = RUNNING
            return RUNNING
        halt_children(children)
        self.running = -1
        self.status = st
        return st


def _switch_ports(cls: type[Switch], n_children: int) -> tuple[Any, ...]:
    cases = tuple(InputPort(f"case_{i + 1}", description=f"value of case {i + 1}") for i in range(max(n_children - 1, 0)))
    return cls.ports + cases


Switch.declared_ports = classmethod(_switch_ports)  # type: ignore[attr-defined,assignment]
