"""The Factory: node registry, XML/builder loading, and tree creation.

    factory = Factory()
    factory.register_condition("IsHungry", lambda ctx: ctx.blackboard.get("hunger") > 50)
    factory.register_action("Eat", eat, ports=[InputPort("food", type=str)])
    tree = factory.create_tree(xml_text)
    tree.tick()

Definitions are cached by XML text: creating 10,000 trees from the same text
parses it once and shares one immutable :class:`TreeDefinition`.
"""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import controls, decorators, leaves, script_nodes
from .blackboard import Blackboard
from .definition import Binding, Element, NodeSpec, SubTreeInfo, TreeDefinition
from .errors import NodeConfigError, PortError, TreeLoadError, XMLFormatError
from .guards import POST_CONDITIONS, PRE_CONDITIONS, guarded_class
from .node import (
    AsyncAction,
    FunctionAction,
    FunctionCondition,
    FunctionStatefulAction,
    TreeNode,
)
from .ports import (
    Port,
    PortDirection,
    blackboard_key,
    coerce,
    convert_from_string,
    normalize_ports,
    type_name,
)
from .subtree import SubTree
from .tree import Tree
from .xml_io import parse_xml

__all__ = ["Factory", "Registration"]

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]*$")
_GUARD_ATTRS = frozenset(PRE_CONDITIONS + POST_CONDITIONS)
_V3_WRAPPERS = ("Action", "Condition", "Control", "Decorator")
# editor metadata: kept for the round trip, no effect on the tree
_METADATA = frozenset({"_description", "_uid", "_fullpath"})


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
    for name in decorators.__all__:
        add(name, getattr(decorators, name))
    for name in leaves.__all__:
        add(name, getattr(leaves, name))
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
    """Registry of node types; turns XML (or builder output) into trees."""

    def __init__(self) -> None:
        self._registry: dict[str, Registration] = dict(_BUILTINS)
        self._cache: dict[tuple[str, str | None, str], TreeDefinition] = {}

    # ---- registration --------------------------------------------------------------
    def _register(self, reg: Registration, replace: bool) -> None:
        if not _NAME_RE.match(reg.id):
            raise ValueError(f"invalid node ID {reg.id!r}")
        if reg.id in ("SubTree", "BehaviorTree", "root", "TreeNodesModel", *_V3_WRAPPERS):
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

    # ---- loading -------------------------------------------------------------------
    def load(self, xml_text: str, *, main_tree: str | None = None,
             filename: str = "<string>") -> TreeDefinition:
        """Parse BT.CPP v4 XML into a (cached) TreeDefinition."""
        key = (xml_text, main_tree, filename)
        d = self._cache.get(key)
        if d is None:
            d = self._load(parse_xml(xml_text, filename), main_tree, filename)
            if len(self._cache) > 256:
                self._cache.clear()
            self._cache[key] = d
        return d

    def load_file(self, path: str | Path, *, main_tree: str | None = None) -> TreeDefinition:
        p = Path(path)
        return self.load(p.read_text(encoding="utf-8"), main_tree=main_tree, filename=str(p))

    def create_tree(
        self,
        xml_text: str,
        blackboard: Blackboard | None = None,
        *,
        main_tree: str | None = None,
        clock: Callable[[], float] | None = None,
        raise_errors: bool = False,
        filename: str = "<string>",
    ) -> Tree:
        """Load (cached) and instantiate: a new Tree over ``blackboard``."""
        return self.load(xml_text, main_tree=main_tree, filename=filename).instantiate(
            blackboard, clock=clock, raise_errors=raise_errors
        )

    def create_tree_from_file(self, path: str | Path, blackboard: Blackboard | None = None,
                              **kwargs: Any) -> Tree:
        return self.load_file(path, main_tree=kwargs.pop("main_tree", None)).instantiate(
            blackboard, **kwargs)

    def define(self, root: Element | Any, *, subtrees: Mapping[str, Element | Any] | None = None,
               main_tree: str = "MainTree") -> TreeDefinition:
        """Build a TreeDefinition from builder elements (see behavior_tree.builder)."""
        trees: dict[str, Element] = {main_tree: Element("BehaviorTree", {"ID": main_tree},
                                                        [_as_element(root)], None, "<builder>")}
        for tid, el in (subtrees or {}).items():
            trees[tid] = Element("BehaviorTree", {"ID": tid}, [_as_element(el)], None, "<builder>")
        return self._definition(trees, {}, main_tree, "<builder>")

    def _load(self, root: Element, main_tree: str | None, source: str) -> TreeDefinition:
        if root.tag != "root":
            raise XMLFormatError(f"the document element must be <root>, not <{root.tag}>",
                                 source=source, line=root.line)
        fmt = root.attrs.get("BTCPP_format")
        if fmt is not None and fmt != "4":
            raise XMLFormatError(f'BTCPP_format="{fmt}" is not supported (only "4")',
                                 source=source, line=root.line)
        trees: dict[str, Element] = {}
        models: dict[str, Element] = {}
        for el in root.children:
            if el.tag == "BehaviorTree":
                tid = el.attrs.get("ID")
                if not tid:
                    raise XMLFormatError("<BehaviorTree> needs an ID", source=source, line=el.line)
                if tid in trees:
                    raise XMLFormatError(f"BehaviorTree ID {tid!r} defined twice",
                                         source=source, line=el.line)
                trees[tid] = el
            elif el.tag == "TreeNodesModel":
                for m in el.children:
                    mid = m.attrs.get("ID")
                    if not mid:
                        raise XMLFormatError(f"<{m.tag}> in TreeNodesModel needs an ID",
                                             source=source, line=m.line)
                    models[mid] = m
            elif el.tag == "include":
                raise XMLFormatError("<include> is not supported: load the files separately",
                                     source=source, line=el.line)
            else:
                raise XMLFormatError(f"unexpected <{el.tag}> under <root>", source=source,
                                     line=el.line)
        if not trees:
            raise XMLFormatError("no <BehaviorTree> in the document", source=source, line=root.line)
        main = main_tree or root.attrs.get("main_tree_to_execute")
        if main is None:
            if len(trees) != 1:
                raise XMLFormatError(
                    "several BehaviorTrees and no main_tree_to_execute: say which one to run",
                    source=source, line=root.line)
            main = next(iter(trees))
        if main not in trees:
            raise XMLFormatError(f"main tree {main!r} is not defined (have: {', '.join(trees)})",
                                 source=source, line=root.line)
        self._check_models(models, source)
        return self._definition(trees, models, main, source)

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

    def _definition(self, trees: dict[str, Element], models: dict[str, Element], main: str,
                    source: str) -> TreeDefinition:
        ctx = _LoadContext(trees, source)
        root_spec = self._tree_root(main, ctx, None)
        if not models:
            models = self._models_for(ctx.used)
        return TreeDefinition(root_spec, main_tree=main, trees=trees, models=models, source=source)

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
                    attrs["default"] = _literal_text(p.default)
                if p.description:
                    attrs["description"] = p.description
                ports.append(Element(tag, attrs))
            out[rid] = Element(reg.kind.capitalize(), {"ID": rid}, ports)
        return out

    def _tree_root(self, tree_id: str, ctx: _LoadContext, caller: Element | None) -> NodeSpec:
        el = ctx.trees.get(tree_id)
        if el is None:
            raise NodeConfigError(f"SubTree ID {tree_id!r} is not defined "
                                  f"(have: {', '.join(ctx.trees)})",
                                  source=caller.source if caller else ctx.source,
                                  line=caller.line if caller else None,
                                  node=caller.describe() if caller else None)
        if tree_id in ctx.stack:
            cycle = " -> ".join([*ctx.stack[ctx.stack.index(tree_id):], tree_id])
            raise NodeConfigError(f"SubTree cycle: {cycle}", source=el.source,
                                  line=caller.line if caller else el.line,
                                  node=caller.describe() if caller else None)
        if len(el.children) != 1:
            raise NodeConfigError(
                f"BehaviorTree {tree_id!r} must have exactly one root node, "
                f"has {len(el.children)}", source=el.source, line=el.line)
        ctx.stack.append(tree_id)
        try:
            return self._spec(el.children[0], ctx)
        finally:
            ctx.stack.pop()

    def _spec(self, el: Element, ctx: _LoadContext) -> NodeSpec:
        if el.tag == "SubTree":
            return self._subtree_spec(el, ctx)
        err = _error_at(el)
        if el.tag in _V3_WRAPPERS and el.fn is None:
            reg_id = el.attrs.get("ID")
            if not reg_id:
                raise err(NodeConfigError, f"<{el.tag}> needs an ID attribute")
        else:
            reg_id = el.tag
        if el.fn is not None:
            reg: Registration | None = _inline_registration(reg_id, el.fn, el)
        else:
            reg = self._registry.get(reg_id)
        if reg is None:
            close = difflib.get_close_matches(reg_id, list(self._registry), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise err(NodeConfigError, f"unknown node ID {reg_id!r}{hint}")
        if el.fn is None:
            ctx.used.add(reg_id)
        cls = reg.cls
        n = len(el.children)
        if reg.n_children is not None and n != reg.n_children:
            raise err(NodeConfigError,
                      f"{reg_id} needs exactly {_count(reg.n_children, 'child')}, "
                      f"has {_count(n, 'child')}")
        if n < cls.min_children or (cls.max_children is not None and n > cls.max_children):
            want = (f"exactly {_count(cls.min_children, 'child')}"
                    if cls.min_children == cls.max_children else
                    f"at least {_count(cls.min_children, 'child')}" if cls.max_children is None
                    else f"{cls.min_children} to {cls.max_children} children")
            raise err(NodeConfigError, f"{reg_id} needs {want}, has {_count(n, 'child')}")
        children = tuple(self._spec(c, ctx) for c in el.children)
        declared = reg.ports_for(n)
        name = el.attrs.get("name") or reg_id
        bindings, scripts = self._bind(el, declared, cls, err)
        literals = {k: b.value for k, b in bindings.items() if b.key is None}
        if cls in (controls.ReactiveSequence, controls.ReactiveFallback):
            async_kids = [c for c in children if c.is_async]
            if len(async_kids) > 1:
                raise err(NodeConfigError,
                          f"{reg_id} has {len(async_kids)} asynchronous children "
                          f"({', '.join(c.describe() for c in async_kids)}); at most one "
                          "may return RUNNING on its own")
        check = getattr(cls, "check_config", None)
        if check is not None:
            problem = check(n, literals)
            if problem:
                raise err(NodeConfigError, problem)
        if any(a in _GUARD_ATTRS for a in scripts):
            cls = guarded_class(cls)
        async_with = getattr(cls, "async_with", None)
        is_async = (reg.is_async or any(c.is_async for c in children)
                    or (async_with is not None and async_with(literals)))
        return NodeSpec(id=reg_id, name=name, cls=cls, children=children, bindings=bindings,
                        port_decls=declared, scripts=scripts, fn=reg.fn, attrs=dict(el.attrs),
                        is_async=is_async, source=el.source, line=el.line)

    def _bind(self, el: Element, declared: dict[str, Port], cls: type[TreeNode],
              err: Callable[..., TreeLoadError]) -> tuple[dict[str, Binding], dict[str, Any]]:
        bindings: dict[str, Binding] = {}
        scripts: dict[str, Any] = {}
        script_ports = getattr(cls, "script_ports", ())
        for attr, raw in el.attrs.items():
            if attr == "name" or attr in _METADATA or (attr == "ID" and el.tag in _V3_WRAPPERS):
                continue
            if attr in _GUARD_ATTRS:
                scripts[attr] = _compile(raw, attr, err)
                continue
            port = declared.get(attr)
            if port is None:
                if attr.startswith("_"):
                    raise err(NodeConfigError, f"unknown special attribute {attr!r}")
                raise err(PortError, f"unknown port {attr!r} (ports: "
                                     f"{', '.join(declared) or 'none'})")
            try:
                key = blackboard_key(raw, attr)
            except ValueError as e:
                raise err(PortError, f"port {attr!r}: {e}") from None
            if key is not None:
                if attr in script_ports:
                    raise err(PortError, f"port {attr!r} must be a literal script, not {raw!r}")
                # a key binding falls back to the port default when the key is missing
                bindings[attr] = Binding(port, key, None if port.required else port.default, raw,
                                         not port.required)
                continue
            if not port.is_input:
                raise err(PortError, f"output port {attr!r} must name a blackboard key "
                                     f"like {{key}}, not {raw!r}")
            try:
                value = (convert_from_string(raw, port.type) if isinstance(raw, str)
                         else coerce(raw, port.type))
            except (TypeError, ValueError):
                raise err(PortError, f"port {attr!r}: {raw!r} is not a valid "
                                     f"{type_name(port.type)}") from None
            if attr in script_ports:
                scripts[attr] = _compile(value, attr, err)
            text = raw if isinstance(raw, str) else _literal_text(raw)  # as the XML will read
            bindings[attr] = Binding(port, None, value, text, False)
        for pname, port in declared.items():
            if pname in bindings or not port.is_input:
                continue
            if port.required:
                raise err(PortError, f"missing required input port {pname!r}"
                                     + (f" ({type_name(port.type)})" if port.type else ""))
            bindings[pname] = Binding(port, None, port.default, None, True)
        return bindings, scripts

    def _subtree_spec(self, el: Element, ctx: _LoadContext) -> NodeSpec:
        err = _error_at(el)
        tid = el.attrs.get("ID")
        if not tid:
            raise err(NodeConfigError, "<SubTree> needs an ID attribute")
        if el.children:
            raise err(NodeConfigError, "<SubTree> takes no children (its content is the "
                                       f"BehaviorTree {tid!r})")
        remap: dict[str, str] = {}
        values: dict[str, Any] = {}
        autoremap = False
        scripts: dict[str, Any] = {}
        for attr, raw in el.attrs.items():
            if attr in ("ID", "name") or attr in _METADATA:
                continue
            if attr == "_autoremap":
                try:
                    autoremap = (raw if isinstance(raw, bool)
                                 else convert_from_string(str(raw), bool))
                except ValueError:
                    raise err(NodeConfigError, f"_autoremap must be true or false, not {raw!r}")\
                        from None
                continue
            if attr in _GUARD_ATTRS:
                scripts[attr] = _compile(raw, attr, err)
                continue
            if attr.startswith("_"):
                raise err(NodeConfigError, f"unknown special attribute {attr!r}")
            try:
                key = blackboard_key(raw, attr)
            except ValueError as e:
                raise err(PortError, f"port {attr!r}: {e}") from None
            if key is not None:
                remap[attr] = key
            else:
                values[attr] = raw
        child = self._tree_root(tid, ctx, el)
        cls = guarded_class(SubTree) if scripts else SubTree
        return NodeSpec(id="SubTree", name=el.attrs.get("name") or tid, cls=cls,
                        children=(child,), scripts=scripts, attrs=dict(el.attrs),
                        is_async=child.is_async,
                        subtree=SubTreeInfo(tid, remap, values, autoremap),
                        source=el.source, line=el.line)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {'children' if noun == 'child' else noun + 's'}"


def _error_at(el: Element) -> Callable[..., TreeLoadError]:
    def make(kind: type[TreeLoadError], problem: str) -> TreeLoadError:
        return kind(problem, source=el.source, line=el.line, node=el.describe())

    return make


def _compile(source: Any, attr: str, err: Callable[..., TreeLoadError]) -> Any:
    from .script import ScriptError, compile_script

    if not isinstance(source, str):
        raise err(NodeConfigError, f"{attr}: a script must be a string, not {source!r}")
    try:
        return compile_script(source)
    except ScriptError as e:
        raise err(NodeConfigError, f"{attr}: {e}") from None


def _literal_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "name") and type(value).__name__ == "Status":
        return value.name
    return str(value)


def _inline_registration(reg_id: str, fn: Any, el: Element) -> Registration:
    """Builder leaves given a function instead of a registered ID."""
    if isinstance(fn, type) and issubclass(fn, TreeNode):
        return Registration(reg_id, fn, tuple(normalize_ports(fn.ports).values()),
                            is_async=fn.is_async)
    ports = tuple(normalize_ports(el.ports).values())
    if el.kind == "condition":
        return Registration(reg_id, FunctionCondition, ports, fn=fn)
    if inspect.iscoroutinefunction(fn):
        return Registration(reg_id, AsyncAction, ports, fn=fn, is_async=True)
    return Registration(reg_id, FunctionAction, ports, fn=fn)


def _as_element(x: Any) -> Element:
    if isinstance(x, Element):
        return x
    to_el = getattr(x, "element", None)
    if to_el is not None:
        return to_el()
    raise TypeError(f"expected a builder node, got {x!r}")
