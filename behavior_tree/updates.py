"""WasEntryUpdated, SkipUnlessUpdated, WaitValueUpdate: reacting to blackboard writes.

Each node watches one blackboard entry (``entry="{key}"`` or ``entry="key"``) and
remembers how many writes it had seen (every write counts, even of an equal
value, as BT.CPP's sequence_id). "Updated" means written since this node last
looked; an entry without a value is never updated.
"""

from __future__ import annotations

from .node import ActionNode, DecoratorNode, TreeNode, tick_child
from .ports import InputPort
from .status import FAILURE, IDLE, RUNNING, SKIPPED, SUCCESS, Status

__all__ = ["SkipUnlessUpdated", "WaitValueUpdate", "WasEntryUpdated"]

_ENTRY = (InputPort("entry", description="the blackboard entry to watch ({key} or key)"),)


def _updated(node: TreeNode) -> bool:
    """Whether the watched entry was written since the last look (and remember it)."""
    b = node.spec.bindings["entry"]
    key = b.key if b.key is not None else str(b.value)
    count = node.blackboard.update_count(key)
    if count is None:
        return False
    seen = node.seen  # type: ignore[attr-defined]
    node.seen = count  # type: ignore[attr-defined]
    return count != seen


class WasEntryUpdated(ActionNode):
    """SUCCESS if ``entry`` was written since this node last ticked, else FAILURE."""

    __slots__ = ("seen",)
    ports = _ENTRY
    initial_state = (("seen", 0),)

    def tick(self) -> Status:
        st = SUCCESS if _updated(self) else FAILURE
        self.status = st
        return st


class SkipUnlessUpdated(DecoratorNode):
    """Ticks the child only if ``entry`` was written since the last look, else returns
    SKIPPED (WaitValueUpdate: RUNNING, so it waits). A RUNNING child is ticked to
    completion without looking at the entry again.

    Halt: halts the child; the count of writes seen is kept.
    """

    __slots__ = ("running", "seen")
    ports = _ENTRY
    initial_state = (("seen", 0), ("running", False))
    if_not_updated: Status = SKIPPED

    def tick(self) -> Status:
        if not self.running and not _updated(self):
            st = self.if_not_updated
            self.status = IDLE if st is SKIPPED else st
            return st
        st = tick_child(self)
        self.running = st is RUNNING
        self.status = IDLE if st is SKIPPED else st
        return st

    def halt(self) -> None:
        c = self.child
        if c.status is RUNNING:
            c.halt()
        c.status = IDLE
        self.running = False
        self.status = IDLE


class WaitValueUpdate(SkipUnlessUpdated):
    """RUNNING until ``entry`` is written, then ticks the child (see SkipUnlessUpdated)."""

    __slots__ = ()
    if_not_updated = RUNNING
    is_async = True
