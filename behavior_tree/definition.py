"""Immutable tree definitions and their cheap instantiation.

A :class:`TreeDefinition` is parsed/built once (from XML or the builder) and
shared by every NPC that runs it: its :class:`NodeSpec` objects hold the node
class, name, registration ID, port bindings, compiled scripts and children.
:meth:`TreeDefinition.instantiate` creates the small per-NPC node objects.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .blackboard import Blackboard
from .node import TreeNode
from .ports import Port
from .status import IDLE

if TYPE_CHECKING:
    from .tree import Tree

__all__ = ["Binding", "Element", "NodeSpec", "TreeDefinition"]


@dataclass
class Element:
    """A parsed XML element (or builder node) before it becomes a NodeSpec.

    ``attrs`` values are strings from XML; the builder may also pass Python
    values and functions (``fn``).
    """

    tag: str
    attrs: dict[str, Any] = field(default_factory=dict)
    children: list[Element] = field(default_factory=list)
    line: int | None = None
    source: str = "<string>"
    fn: Any = None  # builder: inline function (or node class) for a leaf
    kind: str | None = None  # builder: "action" or "condition" for an inline function
    ports: tuple[Any, ...] = ()  # builder: ports of an inline function
    text: str = ""  # text content (only TreeNodesModel port descriptions have any)

    def describe(self) -> str:
        name = self.attrs.get("name")
        ident = (self.attrs.get("ID") if self.tag in ("SubTree", "Action", "Condition", "Control",
                                                      "Decorator", "BehaviorTree") else None)
        label = self.tag if ident is None else f"{self.tag} ID={ident!r}"
        return f"{label} (name={name!r})" if isinstance(name, str) and name else label


class Binding:
    """How one port is bound: to a blackboard ``key`` or to a converted literal ``value``."""

    __slots__ = ("has_default", "key", "port", "text", "type", "value")

    def __init__(self, port: Port, key: str | None, value: Any, text: str | None,
                 has_default: bool) -> None:
        self.port = port
        self.key = key
        self.value = value
        self.type = port.type
        self.text = text  # original attribute text (None when the port took its default)
        self.has_default = has_default

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Binding)
            and (self.key, self.value, self.port.name) == (other.key, other.value, other.port.name)
        )

    def __repr__(self) -> str:
        return f"Binding({self.port.name}={'{' + self.key + '}' if self.key else repr(self.value)})"


class NodeSpec:
    """Everything about one node that every instance shares (immutable by convention)."""

    __slots__ = (
        "attrs", "bindings", "children", "cls", "enums", "fn", "id", "is_async", "kind", "line",
        "name", "port_decls", "scripts", "source", "subtree", "uid",
    )

    def __init__(
        self,
        *,
        id: str,
        name: str,
        cls: type[TreeNode],
        children: tuple[NodeSpec, ...] = (),
        bindings: dict[str, Binding] | None = None,
        port_decls: dict[str, Port] | None = None,
        scripts: dict[str, Callable[[Any], Any]] | None = None,
        fn: Any = None,
        attrs: dict[str, Any] | None = None,
        is_async: bool = False,
        subtree: SubTreeInfo | None = None,
        source: str = "<string>",
        line: int | None = None,
        enums: Mapping[str, Any] | None = None,
    ) -> None:
        self.id = id
        self.name = name
        self.cls = cls
        self.kind = cls.kind
        self.children = children
        self.bindings = bindings or {}
        self.port_decls = port_decls or {}
        self.scripts = scripts or {}
        self.fn = fn
        self.attrs = attrs or {}
        self.is_async = is_async
        self.subtree = subtree
        self.source = source
        self.line = line
        self.enums = _NO_ENUMS if enums is None else enums  # scripting enums (Switch, scripts)
        self.uid = -1

    def describe(self) -> str:
        where = f" at {self.source}:{self.line}" if self.line is not None else ""
        return f"{self.name!r} ({self.id}){where}"

    def port_strings(self) -> dict[str, str]:
        out = {}
        for name, b in self.bindings.items():
            out[name] = "{" + b.key + "}" if b.key is not None else (
                b.text if b.text is not None else str(b.value))
        return out

    def walk(self) -> Iterator[NodeSpec]:
        yield self
        for c in self.children:
            yield from c.walk()

    def structure(self) -> tuple[Any, ...]:
        """A comparable summary (for round-trip checks)."""
        scripts = tuple(sorted((k, getattr(v, "source", repr(v))) for k, v in self.scripts.items()))
        ports = tuple(sorted(self.port_strings().items()))
        sub = None
        if self.subtree is not None:
            sub = (self.subtree.tree_id, tuple(sorted(self.subtree.remap.items())),
                   tuple(sorted((k, repr(v)) for k, v in self.subtree.values.items())),
                   self.subtree.autoremap)
        return (self.id, self.name, self.cls.__name__, ports, scripts, sub,
                tuple(c.structure() for c in self.children))

    def __repr__(self) -> str:
        return f"NodeSpec({self.id!r}, name={self.name!r}, children={len(self.children)})"


_NO_ENUMS: Mapping[str, Any] = {}


@dataclass(frozen=True)
class SubTreeInfo:
    """How a SubTree's blackboard is wired: ``remap`` (inner key -> caller's key),
    ``values`` (inner key -> literal, owned by the subtree's blackboard even with
    ``autoremap``), ``autoremap`` (share every key not starting with ``_``)."""

    tree_id: str
    remap: Mapping[str, str]  # inner key -> outer key
    values: Mapping[str, Any]  # inner key -> literal value
    autoremap: bool


class TreeDefinition:
    """An immutable, shareable tree: ``instantiate()`` it once per NPC.

    ``root`` is the main tree's root spec (SubTrees expanded); ``trees`` the
    source elements of every ``<BehaviorTree>`` (for writing XML back);
    ``main_tree`` the ID of the main tree; ``models`` the ``<TreeNodesModel>``
    entries (registration ID -> element).
    """

    def __init__(
        self,
        root: NodeSpec,
        *,
        main_tree: str,
        trees: dict[str, Element],
        models: dict[str, Element] | None = None,
        source: str = "<string>",
    ) -> None:
        self.root = root
        self.main_tree = main_tree
        self.trees = trees
        self.models = models or {}
        self.source = source
        self.specs: tuple[NodeSpec, ...] = tuple(root.walk())
        for i, s in enumerate(self.specs):
            s.uid = i
        self._plan, self._bb_plan, self._entry_plan = _make_plan(self.specs)

    def __len__(self) -> int:
        return len(self.specs)

    def structure(self) -> tuple[Any, ...]:
        return (self.main_tree, self.root.structure())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TreeDefinition) and self.structure() == other.structure()

    def __hash__(self) -> int:
        return hash(self.structure())

    def instantiate(
        self,
        blackboard: Blackboard | None = None,
        *,
        clock: Callable[[], float] | None = None,
        raise_errors: bool = False,
    ) -> Tree:
        """Build a fresh Tree (all nodes IDLE) over ``blackboard`` (a new one if None)."""
        from .tree import Tree

        bb = Blackboard() if blackboard is None else blackboard
        bbs = [bb]
        for parent, sub in self._bb_plan:
            cbb = Blackboard(bbs[parent], remap=sub.remap, autoremap=sub.autoremap)
            for k, v in sub.values.items():
                cbb.set_local(k, v)
            bbs.append(cbb)
        for i, keys in self._entry_plan:  # as BT.CPP: every {key} exists once the tree is built
            make = bbs[i]._entry_for_write
            for k in keys:
                make(k)
        tree = Tree.__new__(Tree)
        nodes: list[Any] = [None] * len(self.specs)
        get = nodes.__getitem__
        for i, cls, spec, kids, single, bbi, state, setup in self._plan:
            node = cls.__new__(cls)
            node.status = IDLE
            node.spec = spec
            node.tree = tree
            node.blackboard = bbs[bbi]
            if kids is not None:
                ch = tuple(map(get, kids))
                node.children = ch
                if single:
                    node.child = ch[0]
            for k, v in state:
                setattr(node, k, v)
            if setup:
                node.setup()
            nodes[i] = node
        tree._init(self, nodes[0], bb, bbs, clock, raise_errors)
        return tree

    def instantiate_many(
        self,
        n: int,
        blackboards: Iterable[Blackboard] | None = None,
        *,
        clock: Callable[[], float] | None = None,
        raise_errors: bool = False,
    ) -> list[Tree]:
        """``n`` trees (over ``blackboards`` if given, one each), with CPython's cyclic
        GC paused meanwhile: a GC pass over a growing heap of fresh nodes otherwise
        costs more than building them (about 4x for 10,000 NPCs)."""
        bbs = iter(blackboards) if blackboards is not None else None
        paused = gc.isenabled()
        gc.disable()
        try:
            return [self.instantiate(None if bbs is None else next(bbs), clock=clock,
                                     raise_errors=raise_errors) for _ in range(n)]
        finally:
            if paused:
                gc.enable()

    def to_xml(self) -> str:
        from .xml_io import definition_to_xml

        return definition_to_xml(self)

    def __repr__(self) -> str:
        return f"TreeDefinition(main_tree={self.main_tree!r}, nodes={len(self.specs)})"


def _needs_setup(cls: type[TreeNode]) -> bool:
    """False when ``initial_state`` alone initialises the node (no Python call needed)."""
    from .node import ParentNode

    setup = cls.setup
    if setup is TreeNode.setup:
        return False
    if setup is ParentNode.setup:
        return cls.reset_state is not ParentNode.reset_state
    return True


def _initial_state(spec: NodeSpec) -> tuple[tuple[str, Any], ...]:
    state = spec.cls.initial_state
    if spec.cls.uses_spec_fn:
        state = (*state, ("fn", spec.fn))
    return state


def _make_plan(specs: tuple[NodeSpec, ...]) -> tuple[list[tuple[Any, ...]], list[tuple[int, Any]],
                                                     list[tuple[int, tuple[str, ...]]]]:
    """Instantiation plan: nodes children-first (index = uid), blackboards parent-first,
    and the keys to create in each blackboard (ports bound to ``{key}``, SubTree remaps)."""
    bb_plan: list[tuple[int, Any]] = []
    bb_of: dict[int, int] = {}
    keys: dict[int, dict[str, None]] = {}
    for s in specs:  # depth-first, parents first
        bbi = bb_of.setdefault(s.uid, 0)
        for b in s.bindings.values():
            if b.key is not None:
                keys.setdefault(bbi, {})[b.key] = None
        if s.subtree is not None:
            bb_plan.append((bbi, s.subtree))
            child_bb = len(bb_plan)
            for inner in s.subtree.remap:
                keys.setdefault(child_bb, {})[inner] = None
            for c in s.children[0].walk():
                bb_of[c.uid] = child_bb
        else:
            for c in s.children:
                bb_of.setdefault(c.uid, bbi)
    plan = []
    for s in reversed(specs):
        kids = tuple(c.uid for c in s.children) if s.children else None
        plan.append((s.uid, s.cls, s, kids, s.kind != "control", bb_of[s.uid],
                     _initial_state(s), _needs_setup(s.cls)))
    return plan, bb_plan, [(i, tuple(k)) for i, k in sorted(keys.items())]
