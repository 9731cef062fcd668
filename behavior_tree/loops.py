"""LoopInt, LoopBool, LoopDouble, LoopString (BehaviorTree.CPP 4.10's LoopNode<T>)."""

from __future__ import annotations

from collections import deque
from typing import Any, ClassVar

from .node import DecoratorNode, tick_child
from .ports import BidirectionalPort, InputPort, OutputPort, coerce, convert_from_string, type_name
from .status import FAILURE, IDLE, RUNNING, SKIPPED, SUCCESS, Status

__all__ = ["LoopBool", "LoopDouble", "LoopInt", "LoopNode", "LoopString", "parse_queue"]


def parse_queue(text: str, item_type: type) -> deque[Any]:
    """``"1;2;3"`` -> deque([1, 2, 3]) for ``item_type`` int (an empty text: empty)."""
    parts = [p for p in text.split(";")] if text.strip() else []
    return deque(convert_from_string(p, item_type) for p in parts)


class LoopNode(DecoratorNode):
    """``<LoopInt queue="1;2;3" value="{v}" if_empty="SUCCESS">``: runs the child once
    per element of ``queue``, writing the element to ``value`` first.

    ``queue`` is a literal (``"a;b;c"``, items converted to the node's type) or a
    blackboard key holding a ``collections.deque`` (popped in place, so the
    blackboard sees the queue shrink, as BT.CPP's SharedQueue), a list or tuple
    (copied when the loop starts), or a ``;``-separated string; a key without a
    value raises BlackboardError out of the tick, as BT.CPP throws. One element per
    tick: after each child SUCCESS the node returns RUNNING, and on the tick after
    the last element it returns ``if_empty`` (SUCCESS, FAILURE or SKIPPED; also
    what an empty queue gives at once). A child FAILURE fails the loop.

    Halt: halts the child; the next tick starts over from the whole queue.
    """

    __slots__ = ("child_running", "current")
    item_type: ClassVar[type] = str
    initial_state = (("child_running", False), ("current", None))

    def tick(self) -> Status:
        popped = False
        if self.status is IDLE:
            self.child_running = False
            self.current = None
            b = self.spec.bindings["queue"]
            if b.key is None:
                self.current = parse_queue(str(b.value), self.item_type)
        if not self.child_running:
            b = self.spec.bindings["queue"]
            if b.key is not None:  # a missing key is an error, as in BT.CPP
                self._read_queue(self.blackboard.get(b.key))
            q = self.current
            if q:
                self.set_output("value", q.popleft())
                popped = True
        if not popped and not self.child_running:
            st = self.get_input("if_empty")
            self.status = IDLE if st is SKIPPED else st
            return st
        st = tick_child(self)
        self.child_running = st is RUNNING
        if st is FAILURE:
            self.status = FAILURE
            return FAILURE
        self.status = RUNNING
        return RUNNING

    def _read_queue(self, value: Any) -> None:
        if isinstance(value, deque):
            self.current = value  # shared: popped in place
        elif self.current is not None:
            return
        elif isinstance(value, str):
            self.current = parse_queue(value, self.item_type)
        elif isinstance(value, (list, tuple)):
            t = self.item_type
            self.current = deque(convert_from_string(v, t) if isinstance(v, str) else coerce(v, t)
                                 for v in value)
        else:
            raise TypeError(f"node {self.spec.describe()}: port 'queue' must hold a deque, a "
                            f"list or a ';'-separated string, not {type(value).__name__}")

    @classmethod
    def loop_ports(cls) -> tuple[Any, ...]:
        return (
            BidirectionalPort("queue", description="elements, ';'-separated, or a deque/list"),
            InputPort("if_empty", type=Status, default=SUCCESS,
                      description="status when the queue is empty: SUCCESS, FAILURE, SKIPPED"),
            OutputPort("value", type=cls.item_type,
                       description=f"the current element ({type_name(cls.item_type)})"),
        )

    @staticmethod
    def async_with(values: dict[str, object]) -> bool:
        return True  # one element per tick: RUNNING by itself


def _loop_class(name: str, item_type: type) -> type[LoopNode]:
    cls = type(name, (LoopNode,), {"__slots__": (), "item_type": item_type,
                                   "__module__": __name__,
                                   "__doc__": f"LoopNode over {type_name(item_type)} elements."})
    cls.ports = cls.loop_ports()
    return cls


LoopInt = _loop_class("LoopInt", int)
LoopBool = _loop_class("LoopBool", bool)
LoopDouble = _loop_class("LoopDouble", float)
LoopString = _loop_class("LoopString", str)
