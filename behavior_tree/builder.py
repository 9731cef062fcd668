"""Build tree definitions in Python, without XML.

    from behavior_tree import builder as b

    definition = b.define(
        b.reactive_fallback(
            b.sequence(b.condition(enemy_near), b.action("Flee")),
            b.sequence(b.condition("IsHungry"), b.action("Eat", food="{meal}")),
            b.action(wander),
        ),
        factory=factory,
    )
    tree = definition.instantiate()

Each helper returns a :class:`BNode`; ``b.node(ID, *children, **attrs)`` covers
any registered ID. Leaves accept a registered ID or a plain function (named
after the function). Keyword arguments are port bindings (``"{key}"`` or a
value) and the special attributes (``name``, ``_skipIf``, ...). The result is
the same TreeDefinition the equivalent XML gives, and ``definition.to_xml()``
writes that XML.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .definition import Element, TreeDefinition

if TYPE_CHECKING:
    from .factory import Factory
    from .ports import Port

__all__ = [
    "BNode", "action", "async_fallback", "async_sequence", "condition", "cooldown", "define",
    "delay", "fallback", "force_failure", "force_success", "if_then_else", "inverter",
    "keep_running_until_failure", "loop", "node", "parallel", "parallel_all", "precondition",
    "reactive_fallback", "reactive_sequence", "repeat", "retry", "run_once", "script",
    "script_condition", "sequence", "sequence_with_memory", "skip_unless_updated", "subtree",
    "switch", "timeout", "try_catch", "unset_blackboard", "wait_value_update",
    "was_entry_updated", "while_do_else",
]


class BNode:
    """One builder node: an ID (or inline function), attributes and children."""

    __slots__ = ("attrs", "children", "fn", "id", "kind", "ports")

    def __init__(self, id: str, children: Iterable[BNode] = (), attrs: Mapping[str, Any] | None
                 = None, fn: Any = None, kind: str | None = None,
                 ports: Iterable[Port | str] = ()) -> None:
        self.id = id
        self.children = tuple(children)
        for c in self.children:
            if not isinstance(c, BNode):
                raise TypeError(f"{id}: children must be builder nodes, got {c!r}")
        self.attrs = {k: v for k, v in (attrs or {}).items() if v is not None}
        self.fn = fn
        self.kind = kind
        self.ports = tuple(ports)

    def element(self) -> Element:
        attrs = dict(self.attrs)
        if self.fn is not None and "name" not in attrs:
            attrs = {"name": self.id, **attrs}
        return Element(self.id, attrs, [c.element() for c in self.children], None, "<builder>",
                       fn=self.fn, kind=self.kind, ports=self.ports)

    def __repr__(self) -> str:
        return f"BNode({self.id!r}, children={len(self.children)})"


def _leaf(what: str | Callable[..., Any] | type, kind: str, ports: Iterable[Port | str],
          attrs: dict[str, Any]) -> BNode:
    if isinstance(what, str):
        return BNode(what, (), attrs)
    name = getattr(what, "__name__", None)
    if not name or name == "<lambda>":
        name = attrs.get("name") or ("Condition" if kind == "condition" else "Action")
    return BNode(name, (), attrs, fn=what, kind=kind, ports=ports)


def node(id: str, *children: BNode, **attrs: Any) -> BNode:
    """Any registered node ID (``node("Switch3", a, b, c, d, variable="{x}", case_1="1")``)."""
    return BNode(id, children, attrs)


def action(what: str | Callable[..., Any] | type, *, ports: Iterable[Port | str] = (),
           **attrs: Any) -> BNode:
    """A registered action ID, or a function ``fn(ctx) -> Status | bool`` / async def / class."""
    return _leaf(what, "action", ports, attrs)


def condition(what: str | Callable[..., Any], *, ports: Iterable[Port | str] = (),
              **attrs: Any) -> BNode:
    """A registered condition ID, or a function ``fn(ctx) -> bool``."""
    return _leaf(what, "condition", ports, attrs)


def script(code: str, **attrs: Any) -> BNode:
    return BNode("Script", (), {"code": code, **attrs})


def script_condition(code: str, **attrs: Any) -> BNode:
    return BNode("ScriptCondition", (), {"code": code, **attrs})


def _control(id: str) -> Callable[..., BNode]:
    def make(*children: BNode, **attrs: Any) -> BNode:
        return BNode(id, children, attrs)

    make.__name__ = id
    make.__doc__ = f"A {id} node over ``children``."
    return make


sequence = _control("Sequence")
sequence_with_memory = _control("SequenceWithMemory")
reactive_sequence = _control("ReactiveSequence")
fallback = _control("Fallback")
reactive_fallback = _control("ReactiveFallback")
if_then_else = _control("IfThenElse")
while_do_else = _control("WhileDoElse")
inverter = _control("Inverter")
force_success = _control("ForceSuccess")
force_failure = _control("ForceFailure")
keep_running_until_failure = _control("KeepRunningUntilFailure")
async_sequence = _control("AsyncSequence")
async_fallback = _control("AsyncFallback")
try_catch = _control("TryCatch")  # try children..., catch child; catch_on_halt=True


def loop(child: BNode, queue: str, value: str, *, item_type: str = "Int", **attrs: Any) -> BNode:
    """``Loop<item_type>`` (Int, Bool, Double, String) over ``queue`` ("1;2;3" or "{key}"),
    writing each element to ``value`` ("{key}")."""
    return BNode(f"Loop{item_type}", (child,), {"queue": queue, "value": value, **attrs})


def skip_unless_updated(child: BNode, entry: str, **attrs: Any) -> BNode:
    return BNode("SkipUnlessUpdated", (child,), {"entry": entry, **attrs})


def wait_value_update(child: BNode, entry: str, **attrs: Any) -> BNode:
    return BNode("WaitValueUpdate", (child,), {"entry": entry, **attrs})


def was_entry_updated(entry: str, **attrs: Any) -> BNode:
    return BNode("WasEntryUpdated", (), {"entry": entry, **attrs})


def unset_blackboard(key: str, **attrs: Any) -> BNode:
    return BNode("UnsetBlackboard", (), {"key": key, **attrs})


def parallel(*children: BNode, success_count: int = -1, failure_count: int = 1,
             **attrs: Any) -> BNode:
    return BNode("Parallel", children, {"success_count": success_count,
                                        "failure_count": failure_count, **attrs})


def parallel_all(*children: BNode, max_failures: int = 1, **attrs: Any) -> BNode:
    return BNode("ParallelAll", children, {"max_failures": max_failures, **attrs})


def switch(variable: str, cases: Iterable[Any], *children: BNode, **attrs: Any) -> BNode:
    """``Switch<N>``: children are the N case branches then the default."""
    cases = list(cases)
    case_attrs = {f"case_{i + 1}": c for i, c in enumerate(cases)}
    return BNode(f"Switch{len(cases)}", children, {"variable": variable, **case_attrs, **attrs})


def repeat(child: BNode, num_cycles: int | str, **attrs: Any) -> BNode:
    return BNode("Repeat", (child,), {"num_cycles": num_cycles, **attrs})


def retry(child: BNode, num_attempts: int | str, **attrs: Any) -> BNode:
    return BNode("RetryUntilSuccessful", (child,), {"num_attempts": num_attempts, **attrs})


def timeout(child: BNode, msec: float | str, **attrs: Any) -> BNode:
    return BNode("Timeout", (child,), {"msec": msec, **attrs})


def delay(child: BNode, delay_msec: float | str, **attrs: Any) -> BNode:
    return BNode("Delay", (child,), {"delay_msec": delay_msec, **attrs})


def cooldown(child: BNode, msec: float | str, **attrs: Any) -> BNode:
    return BNode("Cooldown", (child,), {"msec": msec, **attrs})


def run_once(child: BNode, then_skip: bool = True, **attrs: Any) -> BNode:
    return BNode("RunOnce", (child,), {"then_skip": then_skip, **attrs})


def precondition(child: BNode, if_: str, else_: str = "FAILURE", **attrs: Any) -> BNode:
    return BNode("Precondition", (child,), {"if": if_, "else": else_, **attrs})


def subtree(tree_id: str, *, autoremap: bool = False, **remap: Any) -> BNode:
    """``<SubTree ID=tree_id>``; keyword arguments remap (``inner="{outer}"``) or set values."""
    attrs: dict[str, Any] = {"ID": tree_id, **remap}
    if autoremap:
        attrs["_autoremap"] = True
    return BNode("SubTree", (), attrs)


def define(root: BNode, *, factory: Factory | None = None,
           subtrees: Mapping[str, BNode] | None = None, main_tree: str = "MainTree"
           ) -> TreeDefinition:
    """Turn builder nodes into a TreeDefinition (``factory`` resolves registered IDs;
    a default Factory with only the built-in nodes if None)."""
    if factory is None:
        from .factory import Factory

        factory = Factory()
    return factory.define(root, subtrees=subtrees, main_tree=main_tree)
