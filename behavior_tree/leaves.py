"""Small built-in leaves from BT.CPP: AlwaysSuccess, AlwaysFailure, SetBlackboard,
UnsetBlackboard, Sleep."""

from __future__ import annotations

from .node import ActionNode
from .ports import InputPort
from .status import FAILURE, RUNNING, SUCCESS, Status

__all__ = ["AlwaysFailure", "AlwaysSuccess", "SetBlackboard", "Sleep", "UnsetBlackboard"]


class AlwaysSuccess(ActionNode):
    __slots__ = ()

    def tick(self) -> Status:
        self.status = SUCCESS
        return SUCCESS


class AlwaysFailure(ActionNode):
    __slots__ = ()

    def tick(self) -> Status:
        self.status = FAILURE
        return FAILURE


_EMPTY = object()


class SetBlackboard(ActionNode):
    """``<SetBlackboard output_key="key" value="literal or {other}"/>``: copies value to
    key; FAILURE when ``value`` names a key that has no value."""

    __slots__ = ()
    ports = (
        InputPort("value", description="value to write"),
        InputPort("output_key", type=str, description="blackboard key written"),
    )

    def tick(self) -> Status:
        value = self.get_input("value", _EMPTY)
        if value is _EMPTY:  # value="{key}" and the key has no value: FAILURE, as BT.CPP
            self.status = FAILURE
            return FAILURE
        self.blackboard.set(self.get_input("output_key"), value)
        self.status = SUCCESS
        return SUCCESS


class UnsetBlackboard(ActionNode):
    """``<UnsetBlackboard key="name"/>``: removes the value of blackboard key ``key``
    (a missing key is fine); SUCCESS."""

    __slots__ = ()
    ports = (InputPort("key", type=str, description="blackboard key whose value is removed"),)

    def tick(self) -> Status:
        self.blackboard.unset(self.get_input("key"))
        self.status = SUCCESS
        return SUCCESS


class Sleep(ActionNode):
    """RUNNING (and asleep) for ``msec`` milliseconds, then SUCCESS."""

    __slots__ = ("until",)
    ports = (InputPort("msec", type=float, description="milliseconds"),)
    is_async = True
    initial_state = (("until", -1.0),)

    def tick(self) -> Status:
        now = self.tree.clock()
        if self.status is not RUNNING:
            self.until = now + self.get_input("msec") / 1000.0
        if now >= self.until:
            self.status = SUCCESS
            return SUCCESS
        self.tree._request_sleep(self, self.until - now)
        self.status = RUNNING
        return RUNNING
