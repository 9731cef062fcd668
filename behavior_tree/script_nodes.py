"""Script and ScriptCondition leaves (scripts are compiled at load time by
:func:`behavior_tree.script.compile_script`; the blackboard is the script env)."""

from __future__ import annotations

from typing import Any

from .node import ActionNode, ConditionNode, TreeNode
from .ports import InputPort
from .status import FAILURE, SUCCESS, Status

__all__ = ["Script", "ScriptCondition", "script_truth"]


def script_truth(node: TreeNode, value: Any) -> bool:
    """Booleans as is, numbers non-zero; anything else is an error."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    raise TypeError(f"node {node.spec.describe()}: script gave {value!r}, not a boolean")


def run_script(node: TreeNode, attr: str) -> tuple[bool, Any]:
    """Run ``node.spec.scripts[attr]`` on the node's blackboard -> (ok, value).

    A failing script is recorded on the tree like a failing callback (ok=False).
    """
    try:
        return True, node.spec.scripts[attr](node.blackboard)
    except Exception as e:
        node.tree._callback_error(node, e)
        return False, None


class Script(ActionNode):
    """``<Script code="..."/>``: runs the script, returns SUCCESS (FAILURE if it raises)."""

    __slots__ = ()
    ports = (InputPort("code", type=str, description="script to run"),)
    script_ports = ("code",)

    def tick(self) -> Status:
        ok, _ = run_script(self, "code")
        st = SUCCESS if ok else FAILURE
        self.status = st
        return st


class ScriptCondition(ConditionNode):
    """``<ScriptCondition code="..."/>``: SUCCESS if the script's value is true."""

    __slots__ = ()
    ports = (InputPort("code", type=str, description="boolean expression"),)
    script_ports = ("code",)

    def tick(self) -> Status:
        ok, value = run_script(self, "code")
        if ok:
            try:
                st = SUCCESS if script_truth(self, value) else FAILURE
            except TypeError as e:
                st = self.tree._callback_error(self, e)
        else:
            st = FAILURE
        self.status = st
        return st
