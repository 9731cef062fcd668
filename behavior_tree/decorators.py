"""Decorator nodes (one child), with BehaviorTree.CPP v4 semantics plus Cooldown.

Durations are milliseconds, as in BT.CPP's XML (``msec``, ``delay_msec``); time
comes from the tree's clock, so tests drive them with a fake clock.
"""

from __future__ import annotations

from .node import DecoratorNode
from .ports import InputPort
from .script_nodes import run_script, script_truth
from .status import FAILURE, IDLE, RUNNING, SKIPPED, SUCCESS, Status

__all__ = [
    "Cooldown",
    "Delay",
    "ForceFailure",
    "ForceSuccess",
    "Inverter",
    "KeepRunningUntilFailure",
    "Precondition",
    "Repeat",
    "RetryUntilSuccessful",
    "RunOnce",
    "Timeout",
]


def _reset_child(node: DecoratorNode) -> None:
    c = node.child
    if c.status is RUNNING:
        c.halt()
    c.status = IDLE


class _OutcomeMap(DecoratorNode):
    """Maps a completed child's SUCCESS / FAILURE to ``on_success`` / ``on_failure`` (and
    resets the child); RUNNING passes through; SKIPPED passes through with this node IDLE."""

    __slots__ = ()
    on_success: Status = SUCCESS
    on_failure: Status = FAILURE

    def tick(self) -> Status:
        st = self.child.tick()
        if st is SUCCESS:
            _reset_child(self)
            st = self.on_success
        elif st is FAILURE:
            _reset_child(self)
            st = self.on_failure
        elif st is SKIPPED:
            self.status = IDLE
            return SKIPPED
        self.status = st
        return st


class Inverter(_OutcomeMap):
    """SUCCESS <-> FAILURE; RUNNING and SKIPPED pass through."""

    __slots__ = ()
    on_success, on_failure = FAILURE, SUCCESS


class ForceSuccess(_OutcomeMap):
    """A completed child (SUCCESS or FAILURE) becomes SUCCESS."""

    __slots__ = ()
    on_success, on_failure = SUCCESS, SUCCESS


class ForceFailure(_OutcomeMap):
    """A completed child (SUCCESS or FAILURE) becomes FAILURE."""

    __slots__ = ()
    on_success, on_failure = FAILURE, FAILURE


class Repeat(DecoratorNode):
    """Runs the child ``num_cycles`` times while it succeeds (``-1``: forever); SUCCESS
    after the last cycle, FAILURE as soon as the child fails (the count restarts).

    As in BT.CPP 4.10, a cycle that started and finished within one tick (a
    synchronous child) hands control back: the node returns RUNNING and the next
    tick runs the next cycle, so other branches are re-checked and a loop never
    spins. A child that was RUNNING and now succeeds goes straight on to the next
    cycle in the same tick. A skipped child skips the node (the count is kept).

    Halt: halts the child and restarts the count.
    """

    __slots__ = ("count",)
    ports = (InputPort("num_cycles", type=int, description="repetitions, -1 = forever"),)

    @staticmethod
    def async_with(values: dict[str, object]) -> bool:
        """More than one cycle (or a count read from the blackboard) returns RUNNING."""
        return values.get("num_cycles", -1) not in (0, 1)

    initial_state = (("count", 0),)

    def tick(self) -> Status:
        cycles = self.get_input("num_cycles")
        child = self.child
        while cycles == -1 or self.count < cycles:
            was_idle = child.status is IDLE
            st = child.tick()
            if st is SUCCESS:
                self.count += 1
                _reset_child(self)
                if was_idle and (cycles == -1 or self.count < cycles):
                    self.status = RUNNING
                    return RUNNING
            elif st is RUNNING:
                self.status = RUNNING
                return RUNNING
            elif st is FAILURE:
                self.count = 0
                _reset_child(self)
                self.status = FAILURE
                return FAILURE
            else:  # skipped child: skip too, keep the count
                self.status = IDLE
                return SKIPPED
        self.count = 0
        self.status = SUCCESS
        return SUCCESS


class RetryUntilSuccessful(DecoratorNode):
    """Runs the child again after each FAILURE, up to ``num_attempts`` attempts (``-1``:
    forever); SUCCESS as soon as the child succeeds, FAILURE when the attempts are
    used up. An attempt that started and failed within one tick hands control back
    (RUNNING; the next tick makes the next attempt), as in BT.CPP 4.10.

    Halt: halts the child and restarts the count of attempts.
    """

    __slots__ = ("attempts",)
    ports = (InputPort("num_attempts", type=int, description="attempts, -1 = forever"),)

    @staticmethod
    def async_with(values: dict[str, object]) -> bool:
        return values.get("num_attempts", -1) not in (0, 1)

    initial_state = (("attempts", 0),)

    def tick(self) -> Status:
        limit = self.get_input("num_attempts")
        child = self.child
        while limit == -1 or self.attempts < limit:
            was_idle = child.status is IDLE
            st = child.tick()
            if st is SUCCESS:
                self.attempts = 0
                _reset_child(self)
                self.status = SUCCESS
                return SUCCESS
            if st is FAILURE:
                self.attempts += 1
                _reset_child(self)
                if was_idle and (limit == -1 or self.attempts < limit):
                    self.status = RUNNING
                    return RUNNING
            elif st is RUNNING:
                self.status = RUNNING
                return RUNNING
            else:
                self.status = IDLE
                return SKIPPED
        self.attempts = 0
        self.status = FAILURE
        return FAILURE


class KeepRunningUntilFailure(DecoratorNode):
    """RUNNING while the child succeeds (restarting it each tick); FAILURE when it fails."""

    __slots__ = ()
    is_async = True

    def tick(self) -> Status:
        st = self.child.tick()
        if st is SUCCESS:
            _reset_child(self)
            st = RUNNING
        elif st is FAILURE:
            _reset_child(self)
        elif st is SKIPPED:
            self.status = IDLE
            return SKIPPED
        self.status = st
        return st


class Timeout(DecoratorNode):
    """Halts the child and fails if it is still RUNNING ``msec`` milliseconds after
    the tick that started it (checked at each tick)."""

    __slots__ = ("deadline",)
    ports = (InputPort("msec", type=float, description="time limit in milliseconds"),)
    initial_state = (("deadline", -1.0),)

    def tick(self) -> Status:
        now = self.tree.clock()
        if self.status is not RUNNING or self.deadline < 0:
            self.deadline = now + self.get_input("msec") / 1000.0
        elif now >= self.deadline:
            _reset_child(self)
            self.deadline = -1.0
            self.status = FAILURE
            return FAILURE
        st = self.child.tick()
        if st is RUNNING:
            self.tree.wake_at(self.deadline)
            self.status = RUNNING
            return RUNNING
        _reset_child(self)
        self.deadline = -1.0
        if st is SKIPPED:
            self.status = IDLE
            return SKIPPED
        self.status = st
        return st


class Delay(DecoratorNode):
    """Waits ``delay_msec`` milliseconds (RUNNING, asleep) from its first tick, then
    ticks the child and returns its status."""

    __slots__ = ("start",)
    ports = (InputPort("delay_msec", type=float, description="delay in milliseconds"),)
    is_async = True

    initial_state = (("start", -1.0),)

    def tick(self) -> Status:
        now = self.tree.clock()
        if self.start < 0:
            self.start = now
        due = self.start + self.get_input("delay_msec") / 1000.0
        if now < due:
            self.tree._request_sleep(self, due - now)
            self.status = RUNNING
            return RUNNING
        st = self.child.tick()
        if st is RUNNING:
            self.status = RUNNING
            return RUNNING
        _reset_child(self)
        self.start = -1.0
        if st is SKIPPED:
            self.status = IDLE
            return SKIPPED
        self.status = st
        return st


class RunOnce(DecoratorNode):
    """Runs the child to completion once. Afterwards returns SKIPPED
    (``then_skip=true``, default) or the child's final status."""

    __slots__ = ("done", "result")
    ports = (
        InputPort("then_skip", type=bool, default=True, description="skip after the first run"),
    )

    initial_state = (("done", False), ("result", IDLE))

    def halt(self) -> None:  # halting does not undo "already ran"
        _reset_child(self)
        self.status = IDLE

    def tick(self) -> Status:
        if self.done:
            if self.get_input("then_skip"):
                self.status = IDLE
                return SKIPPED
            self.status = self.result
            return self.result
        st = self.child.tick()
        if st is SUCCESS or st is FAILURE:
            self.done = True
            self.result = st
            _reset_child(self)
        elif st is SKIPPED:
            self.status = IDLE
            return SKIPPED
        self.status = st
        return st


class Cooldown(DecoratorNode):
    """Lets the child run at most once per ``msec`` milliseconds.

    The cooldown starts when the child completes (SUCCESS or FAILURE). While it
    lasts the node returns FAILURE without ticking the child (so a Fallback
    moves on) and tells the tree when it ends, so a sleeping tree wakes then.
    A RUNNING child is never interrupted by the cooldown.
    """

    __slots__ = ("ready_at",)
    ports = (InputPort("msec", type=float, description="minimum time between runs, ms"),)
    initial_state = (("ready_at", float("-inf")),)

    def halt(self) -> None:  # an interrupted run does not start a cooldown
        _reset_child(self)
        self.status = IDLE

    def tick(self) -> Status:
        if self.status is not RUNNING:
            now = self.tree.clock()
            if now < self.ready_at:
                self.tree.wake_at(self.ready_at)
                self.status = FAILURE
                return FAILURE
        st = self.child.tick()
        if st is SUCCESS or st is FAILURE:
            _reset_child(self)
            self.ready_at = self.tree.clock() + self.get_input("msec") / 1000.0
        elif st is SKIPPED:
            self.status = IDLE
            return SKIPPED
        self.status = st
        return st


class Precondition(DecoratorNode):
    """``<Precondition if="script" else="FAILURE">``: when the child is not
    running, evaluates ``if``; true ticks the child, false returns ``else``
    (FAILURE by default) without ticking it. While the child is RUNNING the
    script is not re-evaluated (as BT.CPP)."""

    __slots__ = ()
    ports = (
        InputPort("if", type=str, description="script; true lets the child run"),
        InputPort("else", type=Status, default=FAILURE, description="status when false"),
    )
    script_ports = ("if",)

    def tick(self) -> Status:
        child = self.child
        if child.status is not RUNNING:
            ok, value = run_script(self, "if")
            try:
                passed = ok and script_truth(self, value)
            except TypeError as e:
                self.tree._callback_error(self, e)
                passed = False
            if not passed:
                st = self.get_input("else")
                self.status = IDLE if st is SKIPPED else st
                return st
        st = child.tick()
        if st is SUCCESS or st is FAILURE:
            _reset_child(self)
        elif st is SKIPPED:
            self.status = IDLE
            return SKIPPED
        self.status = st
        return st

