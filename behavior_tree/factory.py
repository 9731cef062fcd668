"""The Factory: node registry, XML/builder loading, and tree creation.

    factory = Factory()
    factory.register_condition("IsHungry", lambda ctx: ctx.blackboard.get("hunger") > 50)
    factory.register_action("Eat", eat, ports=[InputPort("food", type=str)])
    tree = factory.create_tree(xml_text)
    tree.tick()

Definitions are cached by XML text: creating 10,000 trees from the same text
parses it once and shares one immutable :class:`TreeDefinition`.

As in BT.CPP, a factory can also keep trees: ``register_behavior_tree_from_text``
/ ``_from_file`` register every ``<BehaviorTree>`` of a document (and of the
files it includes) under its ID, ``create_tree_by_id`` builds one, and any later
document may use them as SubTrees.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from . import async_controls, controls, decorators, leaves, loops, script_nodes, updates
from .blackboard import Blackboard
from .definition import Element, TreeDefinition
from .documents import Document, SubTreeModel, read_document
from .errors import NodeConfigError, PortError, XMLFormatError
from .node import (
    AsyncAction,
    FunctionAction,
    FunctionCondition,
    FunctionStatefulAction,
    TreeNode,
)
from .ports import Port, PortDirection, normalize_ports, type_name
from .spec_builder import RESERVED_NODE_IDS, SpecBuilder
from .tree import Tree
from .xml_io import literal_text, parse_xml

__all__ = ["Factory", "Registration"]

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]*$")
_ENUM_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Registration:
    """A registered node type. ``fn`` is the user function(s) for function nodes;
    ``n_children`` fixes the child count (Switch<N>); ``builtin`` marks BT.CPP's nodes."""

    id: str
    cls: type[TreeNode]
    ports: tuple[Port, ...]
    fn: Any = None
    description: str = ""
    builtin: bool = False
    n_children: int | None = None
    is_async: bool = False

    @property
    def kind(self) -> str:
        return self.cls.kind

    def ports_for(self, n_children: int) -> dict[str, Port]:
        declared = getattr(self.cls, "declared_ports", None)
        if declared is not None and self.fn is None:
            return normalize_ports(declared(n_children))
        return normalize_ports(self.ports)


def _builtin_registrations() -> dict[str, Registration]:
    regs: dict[str, Registration] = {}

    def add(name: str, cls: type[TreeNode], n_children: int | None = None) -> None:
        regs[name] = Registration(name, cls, tuple(cls.ports), builtin=True,
                                  n_children=n_children, is_async=cls.is_async)

    for name in ("Sequence", "SequenceWithMemory", "ReactiveSequence", "Fallback",
                 "ReactiveFallback", "Parallel", "ParallelAll", "IfThenElse", "WhileDoElse"):
        add(name, getattr(controls, name))
    add("SequenceStar", controls.SequenceWithMemory)  # BT.CPP v3 name
    for n in range(2, 7):
        add(f"Switch{n}", controls.Switch, n_children=n + 1)
    for module in (async_controls, decorators, leaves, loops, updates):
        for name in module.__all__:
            cls = getattr(module, name)
            if isinstance(cls, type) and issubclass(cls, TreeNode) and cls is not loops.LoopNode:
                add(name, cls)
    add("Script", script_nodes.Script)
    add("ScriptCondition", script_nodes.ScriptCondition)
    return regs


_BUILTINS = _builtin_registrations()


class _LoadContext:
    def __init__(self, trees: dict[str, Element], source: str) -> None:
        self.trees = trees
        self.source = source
        self.stack: list[str] = []
        self.used: set[str] = set()


class Factory:
    """Registry of node types, scripting enums and named trees; turns XML (or builder
    output) into trees."""

    def __init__(self) -> None:
        self._registry: dict[str, Registration] = dict(_BUILTINS)
        self._cache: dict[tuple[Any, ...], TreeDefinition] = {}
        self._enums: dict[str, int] = {}
        self._trees: dict[str, Element] = {}  # registered BehaviorTrees by ID
        self._tree_models: dict[str, Element] = {}
        self._subtree_models: dict[str, SubTreeModel] = {}
        self._lone_trees = 0  # BehaviorTree_<n> names given to trees without an ID

    # ---- registration --------------------------------------------------------------
    def _register(self, reg: Registration, replace: bool) -> None:
        if not _NAME_RE.match(reg.id):
            raise ValueError(f"invalid node ID {reg.id!r}")
        if reg.id in RESERVED_NODE_IDS:
            raise ValueError(f"node ID {reg.id!r} is reserved")
        old = self._registry.get(reg.id)
        if old is not None and (old.builtin or not replace):
            raise ValueError(
                f"node ID {reg.id!r} is already registered"
                + (" (built-in)" if old.builtin else "; pass replace=True to override")
            )
        self._registry[reg.id] = reg
        self._cache.clear()

    def register_action(
        self,
        name: str,
        fn_or_class: Callable[..., Any] | type[TreeNode],
        ports: Iterable[Port | str] | None = None,
        *,
        description: str = "",
        replace: bool = False,
    ) -> None:
        """Register an action.

        ``fn_or_class`` is a plain function ``fn(ctx) -> Status | bool`` (RUNNING
        allowed), an ``async def`` (run as an asyncio task, see AsyncAction), or a
        TreeNode subclass (ActionNode, StatefulAction, ...; its ``ports`` are used).
        """
        if isinstance(fn_or_class, type):
            if not issubclass(fn_or_class, TreeNode):
                raise TypeError(f"{fn_or_class!r} is not a TreeNode subclass")
            cls = fn_or_class
            port_list = tuple(normalize_ports(cls.ports if ports is None else ports).values())
            if ports is not None:
                cls = type(cls.__name__, (cls,), {"__slots__": (), "ports": port_list,
                                                   "__module__": cls.__module__})
            self._register(Registration(name, cls, port_list, description=description,
                                        is_async=cls.is_async), replace)
            return
        if not callable(fn_or_class):
            raise TypeError(f"register_action({name!r}): expected a function or a node class")
        port_list = tuple(normalize_ports(ports).values())
        if inspect.iscoroutinefunction(fn_or_class):
            reg = Registration(name, AsyncAction, port_list, fn=fn_or_class,
                               description=description, is_async=True)
        else:
            reg = Registration(name, FunctionAction, port_list, fn=fn_or_class,
                               description=description)
        self._register(reg, replace)

    def register_condition(
        self,
        name: str,
        fn: Callable[..., Any],
        ports: Iterable[Port | str] | None = None,
        *,
        description: str = "",
        replace: bool = False,
    ) -> None:
        """Register a condition ``fn(ctx) -> bool`` (or SUCCESS/FAILURE)."""
        if isinstance(fn, type):
            if not issubclass(fn, TreeNode):
                raise TypeError(f"{fn!r} is not a TreeNode subclass")
            self._register(Registration(name, fn, tuple(normalize_ports(fn.ports).values()),
                                        description=description), replace)
            return
        if not callable(fn) or inspect.iscoroutinefunction(fn):
            raise TypeError(f"register_condition({name!r}): expected a plain function")
        self._register(Registration(name, FunctionCondition, tuple(normalize_ports(ports).values()),
                                    fn=fn, description=description), replace)

    def register_stateful_action(
        self,
        name: str,
        on_start: Callable[..., Any],
        on_running: Callable[..., Any],
        on_halted: Callable[..., Any] | None = None,
        ports: Iterable[Port | str] | None = None,
        *,
        description: str = "",
        replace: bool = False,
    ) -> None:
        """Register a StatefulAction from functions of ``ctx``."""
        self._register(Registration(name, FunctionStatefulAction,
                                    tuple(normalize_ports(ports).values()),
                                    fn=(on_start, on_running, on_halted),
                                    description=description, is_async=True), replace)

    def register_node(self, name: str, cls: type[TreeNode], *, description: str = "",
                      replace: bool = False) -> None:
        """Register any node class (control, decorator or leaf) under ``name``."""
        if not (isinstance(cls, type) and issubclass(cls, TreeNode)):
            raise TypeError(f"{cls!r} is not a TreeNode subclass")
        self._register(Registration(name, cls, tuple(normalize_ports(cls.ports).values()),
                                    description=description, is_async=cls.is_async), replace)

    def registration(self, name: str) -> Registration:
        return self._registry[name]

    @property
    def registered(self) -> Mapping[str, Registration]:
        return dict(self._registry)

    # ---- scripting enums -------------------------------------------------------------
    def register_scripting_enum(self, name: str, value: int) -> None:
        """Make ``name`` an integer constant in scripts and Switch cases (BT.CPP's
        ``registerScriptingEnum``): ``color := RED``, ``color == RED``, ``case_1="RED"``.
        A string compared with a number converts through these names too
        (``'RED' == 1``). Registering a name again with another value is an error."""
        if not _ENUM_NAME_RE.match(name) or name in ("true", "false"):
            raise ValueError(f"invalid enum name {name!r}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"enum {name!r}: the value must be an int, not {value!r}")
        old = self._enums.get(name)
        if old is not None and old != value:
            raise ValueError(f"enum {name!r} is already registered with the value {old!r}")
        self._enums[name] = value
        self._cache.clear()

    def register_scripting_enums(self, enum: type[Enum] | Mapping[str, int]) -> None:
        """Register every member of an ``Enum`` class with int values (an ``IntEnum``),
        or every item of a mapping (BT.CPP's ``registerScriptingEnums<E>()``)."""
        items = (enum.items() if isinstance(enum, Mapping)
                 else ((m.name, m.value) for m in enum))  # type: ignore[union-attr]
        for name, value in items:
            self.register_scripting_enum(name, value)

    @property
    def scripting_enums(self) -> Mapping[str, int]:
        return dict(self._enums)

    # ---- loading -------------------------------------------------------------------
    def load(self, xml_text: str, *, main_tree: str | None = None,
             filename: str = "<string>", include_root: str | Path | None = None
             ) -> TreeDefinition:
        """Parse BT.CPP v4 XML into a (cached) TreeDefinition of its main tree.

        The main tree is ``main_tree``, else the document's ``main_tree_to_execute``,
        else its only ``<BehaviorTree>``. SubTrees may come from the document, the
        files it includes (``include_root``: the folder they may be read from; text
        needs one to include anything) and the trees registered on this factory.
        """
        key = (xml_text, main_tree, filename, None if include_root is None else str(include_root))
        d = self._cache.get(key)
        if d is None:
            path = Path(filename) if filename != "<string>" else None
            doc = self._read(xml_text, filename, path, include_root, per_factory=False)
            d = self._main_definition(doc, main_tree)
            if not doc.includes:  # included files may change on disk: not cached
                if len(self._cache) > 256:
                    self._cache.clear()
                self._cache[key] = d
        return d

    def load_file(self, path: str | Path, *, main_tree: str | None = None,
                  include_root: str | Path | None = None) -> TreeDefinition:
        """:meth:`load` for a file. ``<include>`` paths are relative to the including
        file and must stay inside ``include_root`` (default: this file's folder)."""
        p = Path(path)
        doc = self._read(p.read_text(encoding="utf-8"), str(p), p, include_root,
                         per_factory=False)
        return self._main_definition(doc, main_tree)

    def create_tree(
        self,
        xml_text: str,
        blackboard: Blackboard | None = None,
        *,
        main_tree: str | None = None,
        clock: Callable[[], float] | None = None,
        raise_errors: bool = False,
        filename: str = "<string>",
        include_root: str | Path | None = None,
    ) -> Tree:
        """Load (cached) and instantiate: a new Tree over ``blackboard``."""
        return self.load(xml_text, main_tree=main_tree, filename=filename,
                         include_root=include_root).instantiate(
            blackboard, clock=clock, raise_errors=raise_errors
        )

    def create_tree_from_file(self, path: str | Path, blackboard: Blackboard | None = None,
                              **kwargs: Any) -> Tree:
        return self.load_file(path, main_tree=kwargs.pop("main_tree", None),
                              include_root=kwargs.pop("include_root", None)).instantiate(
            blackboard, **kwargs)

    # ---- registered trees (BT.CPP's registerBehaviorTreeFrom...) ----------------------
    def register_behavior_tree_from_text(self, xml_text: str, *, filename: str = "<string>",
                                         include_root: str | Path | None = None) -> list[str]:
        """Register every ``<BehaviorTree>`` of the document (and of its includes) under
        its ID; returns the IDs. A tree without an ID is named ``BehaviorTree_<n>``. A
        registered ID is replaced by a later registration, as in BT.CPP. Trees are
        checked when built (:meth:`create_tree_by_id`)."""
        doc = self._read(xml_text, filename, None, include_root, per_factory=True)
        return self._register_document(doc)

    def register_behavior_tree_from_file(self, path: str | Path, *,
                                         include_root: str | Path | None = None) -> list[str]:
        """:meth:`register_behavior_tree_from_text` for a file (includes resolved as in
        :meth:`load_file`)."""
        p = Path(path)
        doc = self._read(p.read_text(encoding="utf-8"), str(p), p, include_root,
                         per_factory=True)
        return self._register_document(doc)

    def registered_behavior_trees(self) -> list[str]:
        """IDs of the registered trees, in registration order."""
        return list(self._trees)

    def definition_by_id(self, tree_id: str) -> TreeDefinition:
        """The TreeDefinition of a registered tree (cached)."""
        key = ("<registered>", tree_id)
        d = self._cache.get(key)
        if d is None:
            if tree_id not in self._trees:
                raise NodeConfigError(f"no registered BehaviorTree {tree_id!r} (have: "
                                      f"{', '.join(self._trees) or 'none'})")
            el = self._trees[tree_id]
            d = self._definition(self._trees, self._tree_models, self._subtree_models, tree_id,
                                 el.source, {tree_id: el})
            self._cache[key] = d
        return d

    def create_tree_by_id(self, tree_id: str, blackboard: Blackboard | None = None, *,
                          clock: Callable[[], float] | None = None,
                          raise_errors: bool = False) -> Tree:
        """Build a registered tree (BT.CPP's ``createTree(ID)``)."""
        return self.definition_by_id(tree_id).instantiate(blackboard, clock=clock,
                                                          raise_errors=raise_errors)

    def define(self, root: Element | Any, *, subtrees: Mapping[str, Element | Any] | None = None,
               main_tree: str = "MainTree") -> TreeDefinition:
        """Build a TreeDefinition from builder elements (see behavior_tree.builder)."""
        trees: dict[str, Element] = {main_tree: Element("BehaviorTree", {"ID": main_tree},
                                                        [_as_element(root)], None, "<builder>")}
        for tid, el in (subtrees or {}).items():
            trees[tid] = Element("BehaviorTree", {"ID": tid}, [_as_element(el)], None, "<builder>")
        return self._definition({**self._trees, **trees}, {}, self._subtree_models, main_tree,
                                "<builder>", trees)

    # ---- internals -------------------------------------------------------------------
    def _read(self, xml_text: str, filename: str, path: Path | None,
              include_root: str | Path | None, *, per_factory: bool) -> Document:
        count = [0]

        def lone_name() -> str:
            if per_factory:
                self._lone_trees += 1
                return f"BehaviorTree_{self._lone_trees - 1}"
            count[0] += 1
            return f"BehaviorTree_{count[0] - 1}"

        return read_document(parse_xml(xml_text, filename), filename, path=path,
                             include_root=None if include_root is None else Path(include_root),
                             parse=parse_xml, is_node_id=self._registry.__contains__,
                             lone_name=lone_name)

    def _verify(self, doc: Document, trees: Mapping[str, Element]) -> None:
        for d in doc.all_documents():
            builder = SpecBuilder(self._registry, trees, {}, self._enums, d.source)
            for el in d.trees.values():
                builder.verify(el)

    def _register_document(self, doc: Document) -> list[str]:
        ids: list[str] = []
        self._verify(doc, {**self._trees, **{t: e for d in doc.all_documents()
                                              for t, e in d.trees.items()}})
        for d in doc.all_documents():
            self._check_models(d.models, d.source)
            for tid, el in d.trees.items():
                self._trees.pop(tid, None)
                self._trees[tid] = el
                ids.append(tid)
            self._tree_models.update(d.models)
            self._subtree_models.update(d.subtree_models)
        self._cache.clear()
        return ids

    def _main_definition(self, doc: Document, main_tree: str | None) -> TreeDefinition:
        trees: dict[str, Element] = dict(self._trees)
        models: dict[str, Element] = dict(self._tree_models)
        subtree_models = dict(self._subtree_models)
        for d in doc.all_documents():
            self._check_models(d.models, d.source)
            trees.update(d.trees)
            models.update(d.models)
            subtree_models.update(d.subtree_models)
        self._verify(doc, trees)
        main = main_tree or doc.main_tree
        if main is None:
            if not doc.trees:
                raise XMLFormatError("no <BehaviorTree> in the document", source=doc.source,
                                     line=doc.root.line)
            if len(doc.trees) != 1:
                raise XMLFormatError(
                    "several BehaviorTrees and no main_tree_to_execute: say which one to run "
                    f"(have: {', '.join(doc.trees)})", source=doc.source, line=doc.root.line)
            main = next(iter(doc.trees))
        if main not in trees:
            raise XMLFormatError(f"main tree {main!r} is not defined (have: "
                                 f"{', '.join(trees) or 'none'})",
                                 source=doc.source, line=doc.root.line)
        return self._definition(trees, models, subtree_models, main, doc.source, doc.trees,
                                own_models=doc.models)

    def _check_models(self, models: dict[str, Element], source: str) -> None:
        for mid, m in models.items():
            reg = self._registry.get(mid)
            if reg is None or m.tag == "SubTree":
                continue
            kind = m.tag.lower()
            if kind in ("action", "condition", "control", "decorator") and kind != reg.kind:
                raise NodeConfigError(
                    f"TreeNodesModel declares {mid!r} as {m.tag}, but it is registered as "
                    f"{reg.kind}", source=source, line=m.line, node=mid)
            declared = reg.ports_for(0)
            for p in m.children:
                pname = p.attrs.get("name")
                if p.tag in ("input_port", "output_port", "inout_port") and pname not in declared:
                    raise PortError(
                        f"TreeNodesModel declares port {pname!r} of {mid!r}, which the "
                        f"registered node does not have (ports: {', '.join(declared) or 'none'})",
                        source=source, line=p.line, node=mid)

    def _definition(self, trees: Mapping[str, Element], models: Mapping[str, Element],
                    subtree_models: Mapping[str, SubTreeModel], main: str, source: str,
                    own_trees: Mapping[str, Element],
                    own_models: Mapping[str, Element] | None = None) -> TreeDefinition:
        builder = SpecBuilder(self._registry, trees, subtree_models, self._enums, source)
        root_spec = builder.tree_root(main)
        # written back by to_xml(): the document's own trees, plus the others it uses
        out_trees = dict(own_trees)
        for tid in builder.used_trees:
            out_trees.setdefault(tid, trees[tid])
        out_models = dict(own_models) if own_models else {}
        if not out_models:
            out_models = {k: v for k, v in models.items() if k in builder.used_trees
                          or k in builder.used} or self._models_for(builder.used)
        return TreeDefinition(root_spec, main_tree=main, trees=out_trees, models=out_models,
                              source=source)

    def _models_for(self, used: set[str]) -> dict[str, Element]:
        out = {}
        for rid in sorted(used):
            reg = self._registry[rid]
            if reg.builtin:
                continue
            ports = []
            for p in reg.ports:
                tag = {PortDirection.INPUT: "input_port", PortDirection.OUTPUT: "output_port",
                       PortDirection.INOUT: "inout_port"}[p.direction]
                attrs = {"name": p.name, "type": type_name(p.type)}
                if not p.required:
                    attrs["default"] = literal_text(p.default)
                if p.description:
                    attrs["description"] = p.description
                ports.append(Element(tag, attrs))
            out[rid] = Element(reg.kind.capitalize(), {"ID": rid}, ports)
        return out


def _as_element(x: Any) -> Element:
    if isinstance(x, Element):
        return x
    to_el = getattr(x, "element", None)
    if to_el is not None:
        return to_el()
    raise TypeError(f"expected a builder node, got {x!r}")
