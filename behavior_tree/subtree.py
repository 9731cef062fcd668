"""The SubTree node: runs another BehaviorTree with its own blackboard."""

from __future__ import annotations

from .node import DecoratorNode
from .status import IDLE, RUNNING, SKIPPED, Status

__all__ = ["SubTree"]


class SubTree(DecoratorNode):
    """``<SubTree ID="Other" inner="{outer}" _autoremap="true"/>``.

    The subtree's root is this node's only child. Its blackboard is a child of
    the caller's: ``inner="{outer}"`` remaps a key, ``inner="literal"`` sets a
    value, ``_autoremap`` shares every key not starting with ``_``.
    """

    __slots__ = ()
    kind = "subtree"

    def tick(self) -> Status:
        st = self.child.tick()
        if st is SKIPPED:
            self.status = IDLE
            return SKIPPED
        if st is not RUNNING:
            c = self.child
            c.status = IDLE
        self.status = st
        return st
