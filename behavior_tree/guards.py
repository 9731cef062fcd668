"""Pre/post conditions on any node (BT.CPP v4's ``_skipIf`` & co).

Pre-conditions, evaluated in this order when the node is IDLE (about to start):
``_failureIf`` (true -> FAILURE), ``_successIf`` (true -> SUCCESS), ``_skipIf``
(true -> SKIPPED), ``_while`` (false -> SKIPPED); the node's own tick is then
not run. While the node is RUNNING only ``_while`` is checked: false halts the
node and returns SKIPPED.

Post-conditions run after the node returns: ``_onSuccess`` on SUCCESS,
``_onFailure`` on FAILURE, ``_post`` on either; ``_onHalted`` when the node is
halted while RUNNING.

Nodes without any of them are instantiated from their plain class; nodes with
some get a subclass whose tick/halt add the checks, chosen once at load time,
so the conditions cost nothing where they are not used.
"""

from __future__ import annotations

from .node import TreeNode
from .script_nodes import run_script, script_truth
from .status import FAILURE, IDLE, RUNNING, SKIPPED, SUCCESS, Status

__all__ = ["POST_CONDITIONS", "PRE_CONDITIONS", "guarded_class"]

PRE_CONDITIONS = ("_failureIf", "_successIf", "_skipIf", "_while")
POST_CONDITIONS = ("_onSuccess", "_onFailure", "_onHalted", "_post")

_PRE_RESULT = {"_failureIf": FAILURE, "_successIf": SUCCESS, "_skipIf": SKIPPED}


def _check(node: TreeNode, attr: str) -> bool | None:
    """The script's truth value; None if it failed (error recorded on the tree)."""
    ok, value = run_script(node, attr)
    if not ok:
        return None
    try:
        return script_truth(node, value)
    except TypeError as e:
        node.tree._callback_error(node, e)
        return None


def _pre(node: TreeNode) -> Status | None:
    scripts = node.spec.scripts
    for attr in PRE_CONDITIONS:
        if attr in scripts:
            v = _check(node, attr)
            if v is None:
                return FAILURE
            if attr == "_while":
                if not v:
                    return SKIPPED
            elif v:
                return _PRE_RESULT[attr]
    return None


_CACHE: dict[type, type] = {}


def guarded_class(cls: type[TreeNode]) -> type[TreeNode]:
    """The subclass of ``cls`` that evaluates the spec's pre/post-condition scripts."""
    g = _CACHE.get(cls)
    if g is not None:
        return g
    base_tick = cls.tick
    base_halt = cls.halt

    def tick(self: TreeNode) -> Status:
        scripts = self.spec.scripts
        st = self.status
        result: Status | None = None
        if st is IDLE:
            result = _pre(self)
        elif st is RUNNING and "_while" in scripts and not _check(self, "_while"):
            self.halt()
            return SKIPPED
        if result is None:
            result = base_tick(self)
        else:
            self.status = IDLE if result is SKIPPED else result
        if result is SUCCESS:
            if "_onSuccess" in scripts:
                run_script(self, "_onSuccess")
        elif result is FAILURE:
            if "_onFailure" in scripts:
                run_script(self, "_onFailure")
        else:
            return result
        if "_post" in scripts:
            run_script(self, "_post")
        return result

    def halt(self: TreeNode) -> None:
        was_running = self.status is RUNNING
        base_halt(self)
        if was_running and "_onHalted" in self.spec.scripts:
            run_script(self, "_onHalted")

    g = type(cls.__name__, (cls,), {"__slots__": (), "tick": tick, "halt": halt,
                                     "__module__": cls.__module__, "_guarded": True})
    _CACHE[cls] = g
    return g
