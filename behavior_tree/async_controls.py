"""AsyncSequence, AsyncFallback and TryCatch (BehaviorTree.CPP 4.10 controls)."""

from __future__ import annotations

from .controls import SequenceWithMemory
from .node import ControlNode, halt_children
from .ports import InputPort
from .status import FAILURE, IDLE, RUNNING, SKIPPED, SUCCESS, Status

__all__ = ["AsyncFallback", "AsyncSequence", "TryCatch"]


class AsyncSequence(SequenceWithMemory):
    """A Sequence that hands control back between children.

    Ticks children in order while they succeed, like ``Sequence``; but when a child
    that was IDLE at the start of the tick succeeds and more children remain, the
    node returns RUNNING and the next tick continues with the next child. So a
    reactive parent re-checks its conditions between the steps. A child that was
    RUNNING and now succeeds lets the next child run in the same tick. FAILURE
    resets it and fails; SKIPPED children are passed over (SKIPPED if all were).

    Halt: halts the running child and forgets the position.
    """

    __slots__ = ()
    _keeps_position = False


class AsyncFallback(AsyncSequence):
    """A Fallback that hands control back between children: when a child that was
    IDLE fails and more children remain, the node returns RUNNING and tries the next
    one on the next tick. SUCCESS of a child resets it and succeeds; FAILURE when
    all failed.

    Halt: halts the running child and forgets the position.
    """

    __slots__ = ()
    _continue_on = FAILURE
    _stop = SUCCESS


class TryCatch(ControlNode):
    """``<TryCatch>`` try children..., then one catch child (at least two children).

    The try children run as a Sequence. If they all succeed (or are skipped) the
    node succeeds (SKIPPED if all were skipped). If one fails, the try children
    are reset and the catch child is ticked, in the same tick and on the
    following ones while it is RUNNING; when it completes, the node returns
    FAILURE whatever the catch child returned.

    Halt: halts the running child. With ``catch_on_halt="true"``, halting the
    node during the try children also ticks the catch child once (and halts it if
    it returns RUNNING), for cleanup.
    """

    __slots__ = ("idx", "in_catch", "skipped")
    min_children = 2
    ports = (InputPort("catch_on_halt", type=bool, default=False,
                       description="tick the catch child when halted in the try children"),)
    initial_state = (("idx", 0), ("skipped", 0), ("in_catch", False))

    def tick(self) -> Status:
        children = self.children
        if self.status is not RUNNING:
            self.skipped = 0
            self.in_catch = False
        if not self.in_catch:
            try_count = len(children) - 1
            while self.idx < try_count:
                st = children[self.idx].tick()
                if st is RUNNING:
                    self.status = RUNNING
                    return RUNNING
                if st is FAILURE:
                    halt_children(children)
                    self.idx = 0
                    self.in_catch = True
                    break
                if st is SKIPPED:
                    self.skipped += 1
                self.idx += 1
            else:  # every try child succeeded or was skipped
                st = SKIPPED if self.skipped == try_count else SUCCESS
                halt_children(children)
                self.idx = 0
                self.skipped = 0
                self.status = IDLE if st is SKIPPED else SUCCESS
                return st
        st = children[-1].tick()
        if st is RUNNING:
            self.status = RUNNING
            return RUNNING
        halt_children(children)
        self.idx = 0
        self.in_catch = False
        self.status = FAILURE
        return FAILURE

    def halt(self) -> None:
        children = self.children
        if (self.status is RUNNING and not self.in_catch
                and self.get_input("catch_on_halt")):
            halt_children(children[:-1])
            catch = children[-1]
            if catch.tick() is RUNNING:
                catch.halt()
            catch.status = IDLE
        super().halt()
