"""behavior_tree: BehaviorTree.CPP v4 semantics in fast, plain CPython.

    from behavior_tree import Factory, Status

    factory = Factory()
    factory.register_condition("IsHungry", lambda ctx: ctx.blackboard.get("hunger") > 50)
    factory.register_action("Eat", lambda ctx: Status.SUCCESS)
    tree = factory.create_tree(xml_text)       # BT.CPP v4 XML (Groot2 files load as is)
    tree.tick()                                # exactly one tick
    tree.halt()

``RUNNING``, ``SUCCESS``, ``FAILURE``, ``IDLE``, ``SKIPPED`` are the Status members as
module constants: on CPython 3.11 reading ``Status.RUNNING`` goes through the enum
metaclass's ``__getattr__`` hook (~0.1 us), so hot callbacks should return the constants.

See docs/behavior_tree.md for the node catalogue and semantics.
"""

from . import builder
from .async_controls import AsyncFallback, AsyncSequence, TryCatch
from .blackboard import Blackboard
from .controls import (
    Fallback,
    IfThenElse,
    Parallel,
    ParallelAll,
    ReactiveFallback,
    ReactiveSequence,
    Sequence,
    SequenceWithMemory,
    Switch,
    WhileDoElse,
)
from .decorators import (
    Cooldown,
    Delay,
    ForceFailure,
    ForceSuccess,
    Inverter,
    KeepRunningUntilFailure,
    Precondition,
    Repeat,
    RetryUntilSuccessful,
    RunOnce,
    Timeout,
)
from .definition import Element, NodeSpec, TreeDefinition
from .errors import (
    BehaviorTreeError,
    BlackboardError,
    BlackboardTypeError,
    NodeConfigError,
    PortError,
    TreeLoadError,
    XMLFormatError,
)
from .factory import Factory, Registration
from .leaves import AlwaysFailure, AlwaysSuccess, SetBlackboard, Sleep, UnsetBlackboard
from .loops import LoopBool, LoopDouble, LoopInt, LoopString
from .node import (
    ActionNode,
    AsyncAction,
    ConditionNode,
    ControlNode,
    DecoratorNode,
    LeafNode,
    StatefulAction,
    TreeNode,
)
from .ports import BidirectionalPort, InputPort, OutputPort, Port
from .scheduler import TreeScheduler
from .script_nodes import Script, ScriptCondition
from .status import FAILURE, IDLE, RUNNING, SKIPPED, SUCCESS, Status
from .subtree import SubTree
from .trace import TickRecord, TickTrace, Transition
from .tree import NodeError, Tree
from .updates import SkipUnlessUpdated, WaitValueUpdate, WasEntryUpdated

__all__ = [
    "FAILURE", "IDLE", "RUNNING", "SKIPPED", "SUCCESS",
    "ActionNode", "AlwaysFailure", "AlwaysSuccess", "AsyncAction", "AsyncFallback",
    "AsyncSequence", "BehaviorTreeError",
    "BidirectionalPort", "Blackboard", "BlackboardError", "BlackboardTypeError",
    "ConditionNode", "ControlNode", "Cooldown", "DecoratorNode", "Delay", "Element",
    "Factory", "Fallback", "ForceFailure", "ForceSuccess", "IfThenElse", "InputPort",
    "Inverter", "KeepRunningUntilFailure", "LeafNode", "LoopBool", "LoopDouble", "LoopInt",
    "LoopString", "NodeConfigError", "NodeError",
    "NodeSpec", "OutputPort", "Parallel", "ParallelAll", "Port", "PortError", "Precondition",
    "ReactiveFallback", "ReactiveSequence", "Registration", "Repeat", "RetryUntilSuccessful",
    "RunOnce", "Script", "ScriptCondition", "Sequence", "SequenceWithMemory", "SetBlackboard",
    "SkipUnlessUpdated", "Sleep", "StatefulAction", "Status", "SubTree", "Switch", "TickRecord",
    "TickTrace", "Timeout", "Transition", "Tree", "TreeDefinition", "TreeLoadError", "TreeNode",
    "TreeScheduler", "TryCatch", "UnsetBlackboard", "WaitValueUpdate", "WasEntryUpdated",
    "WhileDoElse", "XMLFormatError", "builder",
]
