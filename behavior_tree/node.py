"""Node base classes and the leaves built from plain functions.

A node object is small per-tree state (``status`` plus what its kind needs);
everything shared by every instance of a definition — name, registration ID,
port bindings, the user function — lives in its :class:`~behavior_tree.definition.NodeSpec`.

The node doubles as the *context* handed to user functions: ``ctx.get_input(port)``,
``ctx.set_output(port, value)``, ``ctx.blackboard``, ``ctx.now()``, ``ctx.sleep()``.

Writing a node class::

    class MoveTo(StatefulAction):
        ports = (InputPort("goal", type=str),)

        def on_start(self):   # first tick: start the work, return RUNNING (or finish at once)
            ...
        def on_running(self):  # following ticks
            ...
        def on_halted(self):   # interrupted while RUNNING
            ...
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from .errors import BlackboardError, BlackboardTypeError
from .ports import Port, coerce, coerce_for_read, type_name
from .status import FAILURE, IDLE, RUNNING, SUCCESS, Status

if TYPE_CHECKING:
    from .blackboard import Blackboard
    from .definition import NodeSpec
    from .tree import Tree

__all__ = [
    "ActionNode",
    "AsyncAction",
    "ConditionNode",
    "ControlNode",
    "DecoratorNode",
    "FunctionAction",
    "FunctionCondition",
    "FunctionStatefulAction",
    "LeafNode",
    "StatefulAction",
    "TreeNode",
]

_MISSING: Any = object()


class TreeNode:
    """Base of every node. Subclasses implement :meth:`tick` (and :meth:`halt` when
    they hold state while RUNNING).

    Class attributes describe the node type: ``ports`` (declared ports),
    ``kind`` ("action", "condition", "control", "decorator" or "subtree"),
    ``is_async`` (may return RUNNING on its own across ticks; informative, shown by
    tools), ``min_children``/``max_children``.
    """

    __slots__ = ("blackboard", "spec", "status", "tree")

    ports: ClassVar[tuple[Port, ...]] = ()
    # (attribute, value) pairs every new instance starts with (immutable values only;
    # anything else goes in setup()). Controls/decorators also restore them on halt.
    initial_state: ClassVar[tuple[tuple[str, Any], ...]] = ()
    kind: ClassVar[str] = "action"
    uses_spec_fn: ClassVar[bool] = False
    is_async: ClassVar[bool] = False
    min_children: ClassVar[int] = 0
    max_children: ClassVar[int | None] = 0

    status: Status
    spec: NodeSpec
    tree: Tree
    blackboard: Blackboard  # the blackboard this node reads and writes (its SubTree's)

    def setup(self) -> None:
        """Called once when the node is instantiated (after status/spec/tree/blackboard and
        ``initial_state`` are set)."""

    def tick(self) -> Status:
        raise NotImplementedError

    def halt(self) -> None:
        """Interrupt a RUNNING node; it and its subtree become IDLE."""
        self.status = IDLE

    # ---- identity -----------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def id(self) -> str:
        """Registration ID (the XML tag / ``ID=`` the node was created from)."""
        return self.spec.id

    @property
    def children(self) -> tuple[TreeNode, ...]:
        return ()

    @property
    def uid(self) -> int:
        """Position of this node in a depth-first walk of the tree (0 = root)."""
        return self.spec.uid

    def port_bindings(self) -> dict[str, str]:
        """Port name -> "{key}" or the literal's string form (for tools)."""
        return self.spec.port_strings()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec.name!r} {self.status.name}>"

    # ---- context API --------------------------------------------------------------
    def get_input(self, name: str, default: Any = _MISSING) -> Any:
        """The value of input port ``name``: its literal, or the blackboard key it is
        bound to, converted to the port type. ``default`` is returned if the port is
        not bound or its key is missing; without one, that raises KeyError."""
        b = self.spec.bindings.get(name)
        if b is None:
            if default is not _MISSING:
                return default
            raise BlackboardError(f"node {self.spec.describe()}: port {name!r} is not bound")
        key = b.key
        if key is None:
            return b.value
        v = self.blackboard.get(key, _MISSING)
        if v is _MISSING:
            if default is not _MISSING:
                return default
            if b.has_default:
                return b.value
            raise BlackboardError(
                f"node {self.spec.describe()}: port {name!r} reads blackboard key {key!r}, "
                "which is missing"
            )
        t = b.type
        if t is not None and v.__class__ is not t and v is not None:
            try:
                v = coerce_for_read(v, t)
            except (TypeError, ValueError):
                raise BlackboardTypeError(
                    f"node {self.spec.describe()}: port {name!r} expects {type_name(t)}, "
                    f"blackboard key {key!r} holds {v!r}"
                ) from None
        return v

    def set_output(self, name: str, value: Any) -> None:
        """Write output port ``name`` to its blackboard key (no-op when unbound)."""
        b = self.spec.bindings.get(name)
        if b is None or b.key is None:
            if name in self.spec.port_decls:
                return
            raise BlackboardError(f"node {self.spec.describe()}: no output port {name!r}")
        t = b.type
        if t is not None and value is not None and value.__class__ is not t:
            try:
                value = coerce(value, t)
            except (TypeError, ValueError):
                raise BlackboardTypeError(
                    f"node {self.spec.describe()}: output port {name!r} expects {type_name(t)}, "
                    f"got {value!r}"
                ) from None
            self.blackboard.declare(b.key, t)
        self.blackboard.set(b.key, value)

    def now(self) -> float:
        """The tree's clock (seconds)."""
        return self.tree.clock()

    def sleep(self, seconds: float | None = None) -> None:
        """Ask the tree to sleep after this tick (call before returning RUNNING).

        The tree sleeps only when every RUNNING leaf asked to; it wakes when a
        blackboard key read during the tick changes, or after ``seconds``.
        """
        self.tree._request_sleep(self, seconds)


class LeafNode(TreeNode):
    __slots__ = ()


class ActionNode(LeafNode):
    """An action implemented as a class: override :meth:`tick`."""

    __slots__ = ()
    kind = "action"


class ConditionNode(LeafNode):
    """A condition implemented as a class: :meth:`tick` returns SUCCESS or FAILURE."""

    __slots__ = ()
    kind = "condition"


def _bad_result(node: TreeNode, r: Any, allowed: str) -> Status:
    return node.tree._callback_error(
        node,
        TypeError(f"node {node.spec.describe()} returned {r!r}; expected {allowed}"),
    )


class FunctionAction(ActionNode):
    """An action from a plain function ``fn(ctx) -> Status | bool``.

    True/False mean SUCCESS/FAILURE; RUNNING keeps the node running (the
    function is called again on the next tick). An exception, or any other
    result, is recorded on the tree and the node returns FAILURE.
    """

    __slots__ = ("fn",)
    uses_spec_fn: ClassVar[bool] = True  # instantiation copies spec.fn into the ``fn`` slot

    def tick(self) -> Status:
        try:
            r = self.fn(self)
        except Exception as e:
            r = self.tree._callback_error(self, e)
        if r is RUNNING:
            self.status = RUNNING
            return RUNNING
        if r is True:
            r = SUCCESS
        elif r is False:
            r = FAILURE
        elif r is not SUCCESS and r is not FAILURE:
            r = _bad_result(self, r, "a Status (RUNNING/SUCCESS/FAILURE) or a bool")
        self.status = r
        return r


class FunctionCondition(ConditionNode):
    """A condition from a plain function ``fn(ctx) -> bool | Status`` (SUCCESS/FAILURE)."""

    __slots__ = ("fn",)
    uses_spec_fn: ClassVar[bool] = True

    def tick(self) -> Status:
        try:
            r = self.fn(self)
        except Exception as e:
            r = self.tree._callback_error(self, e)
        if r is False:
            self.status = FAILURE
            return FAILURE
        if r is True:
            self.status = SUCCESS
            return SUCCESS
        if r is not SUCCESS and r is not FAILURE:
            r = _bad_result(self, r, "a bool, SUCCESS or FAILURE")
        self.status = r
        return r


def _as_status(node: TreeNode, r: Any) -> Status:
    if r is True:
        return SUCCESS
    if r is False:
        return FAILURE
    if r is RUNNING or r is SUCCESS or r is FAILURE:
        return r
    return _bad_result(node, r, "a Status (RUNNING/SUCCESS/FAILURE) or a bool")


class StatefulAction(ActionNode):
    """An action with a life cycle (BT.CPP's StatefulActionNode).

    ``on_start`` runs on the tick that starts the action, ``on_running`` on each
    following tick while it is RUNNING, ``on_halted`` when it is interrupted
    while RUNNING. The first two return a Status or a bool.
    """

    __slots__ = ()
    is_async = True

    def on_start(self) -> Status | bool:
        raise NotImplementedError

    def on_running(self) -> Status | bool:
        raise NotImplementedError

    def on_halted(self) -> None:
        pass

    def tick(self) -> Status:
        try:
            r = self.on_running() if self.status is RUNNING else self.on_start()
        except Exception as e:
            r = self.tree._callback_error(self, e)
        r = _as_status(self, r)
        self.status = r
        return r

    def halt(self) -> None:
        if self.status is RUNNING:
            try:
                self.on_halted()
            except Exception as e:
                self.tree._callback_error(self, e)
        self.status = IDLE


class FunctionStatefulAction(StatefulAction):
    """A StatefulAction from three functions ``on_start(ctx)``, ``on_running(ctx)``,
    ``on_halted(ctx)`` (the last optional), registered with
    ``Factory.register_stateful_action``."""

    __slots__ = ()

    def on_start(self) -> Status | bool:
        return self.spec.fn[0](self)

    def on_running(self) -> Status | bool:
        return self.spec.fn[1](self)

    def on_halted(self) -> None:
        if self.spec.fn[2] is not None:
            self.spec.fn[2](self)


class AsyncAction(ActionNode):
    """An action from ``async def fn(ctx) -> Status | bool``.

    The first tick starts the coroutine as a task on the running asyncio loop;
    the node is RUNNING until the task finishes, then returns its result. While
    waiting it asks the tree to sleep, and the task's completion wakes the tree.
    ``halt()`` cancels the task. Ticking with no running loop is an error
    (recorded, FAILURE).
    """

    __slots__ = ("task",)
    is_async = True
    initial_state = (("task", None),)

    def tick(self) -> Status:
        task = self.task
        if task is None:
            try:
                loop = asyncio.get_running_loop()
                task = loop.create_task(self.spec.fn(self))
            except Exception as e:
                r = self.tree._callback_error(self, e)
                self.status = r
                return r
            self.task = task
            task.add_done_callback(self._done)
        if not task.done():
            self.tree._request_sleep(self, None)
            self.status = RUNNING
            return RUNNING
        self.task = None
        if task.cancelled():
            r = self.tree._callback_error(self, asyncio.CancelledError("task was cancelled"))
        elif task.exception() is not None:
            r = self.tree._callback_error(self, task.exception())  # type: ignore[arg-type]
        else:
            r = _as_status(self, task.result())
        self.status = r
        return r

    def _done(self, task: asyncio.Task[Any]) -> None:
        if task is self.task:
            self.tree.wake()

    def halt(self) -> None:
        task = self.task
        self.task = None
        if task is not None and not task.done():
            task.cancel()
        self.status = IDLE


class ParentNode(TreeNode):
    """What controls and decorators share: progress they forget on halt."""

    __slots__ = ()

    def reset_state(self) -> None:
        """Forget progress (called on halt): restores ``initial_state`` by default.
        Override it (state that is not immutable) and it also runs at instantiation."""
        for k, v in self.initial_state:
            setattr(self, k, v)

    def setup(self) -> None:
        self.reset_state()


class ControlNode(ParentNode):
    """A node with one or more children, ticked in an order the subclass defines."""

    __slots__ = ("children",)
    kind = "control"
    min_children = 1
    max_children = None

    children: tuple[TreeNode, ...]  # type: ignore[assignment]

    def halt(self) -> None:
        halt_children(self.children)
        self.reset_state()
        self.status = IDLE


class DecoratorNode(ParentNode):
    """A node with exactly one child."""

    __slots__ = ("child", "children")
    kind = "decorator"
    min_children = 1
    max_children = 1

    child: TreeNode
    children: tuple[TreeNode, ...]  # type: ignore[assignment]

    def halt(self) -> None:
        c = self.child
        if c.status is RUNNING:
            c.halt()
        c.status = IDLE
        self.reset_state()
        self.status = IDLE


def tick_child(node: DecoratorNode) -> Status:
    """Tick a decorator's child; a child that completed (SUCCESS or FAILURE) is reset
    to IDLE, ready to run again."""
    c = node.child
    st = c.tick()
    if st is SUCCESS or st is FAILURE:
        c.status = IDLE
    return st


def halt_children(children: tuple[TreeNode, ...]) -> None:
    """BT.CPP's resetChildren: halt the RUNNING ones, then all become IDLE."""
    for c in children:
        if c.status is RUNNING:
            c.halt()
        c.status = IDLE


def iter_nodes(root: TreeNode) -> Iterator[TreeNode]:
    """Depth-first, parents before children."""
    stack = [root]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))
