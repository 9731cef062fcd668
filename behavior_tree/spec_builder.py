"""Turning ``<BehaviorTree>`` elements into NodeSpecs (the factory's load step).

The rules are BT.CPP 4.10's ``XMLParser`` ones, checked at load time so that a
bad document fails before any tick, each error naming the file, the line and the
node:

* node IDs must be registered; child counts must fit the node type;
* attributes are ports of the node, pre/post-condition scripts, or ignored: ``name``,
  Groot2's metadata and every attribute that is not a valid port name (such as
  ``_comment``), as BT.CPP does. An unknown port is an error;
* ``"{key}"`` binds a port to a blackboard key (spaces around the braces are
  allowed, ``{=}`` means the port's own name); anything else is a literal,
  converted to the port type at load time;
* ``<SubTree>`` expands another tree. Its attributes remap keys (``inner="{outer}"``)
  or set literals in the subtree's own blackboard, typed as BT.CPP does (an integer
  text becomes an int, a real number text a float, anything else stays a string).
  A ``<TreeNodesModel><SubTree>`` model adds its port defaults for the ports a
  SubTree does not set (unless ``_autoremap``), and a model port without default
  must be set. Two SubTrees with the same ``name`` in one tree instance, a cycle of
  SubTrees, and a SubTree ID that is the ID of a registered node are errors;
* a ReactiveSequence may not have two ``AsyncSequence`` children (BT.CPP's one
  load-time rule about asynchronous children: each AsyncSequence would restart the
  other, so neither could finish).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .definition import Binding, Element, NodeSpec, SubTreeInfo
from .documents import RESERVED_ATTRIBUTES, SubTreeModel, model_name_problem
from .errors import NodeConfigError, PortError, TreeLoadError
from .guards import POST_CONDITIONS, PRE_CONDITIONS, guarded_class
from .node import AsyncAction, FunctionAction, FunctionCondition, TreeNode
from .ports import Port, blackboard_key, coerce, convert_from_string, normalize_ports, type_name
from .subtree import SubTree
from .xml_io import literal_text

if TYPE_CHECKING:
    from .factory import Registration

__all__ = ["SpecBuilder", "subtree_literal"]

GUARD_ATTRS = frozenset(PRE_CONDITIONS + POST_CONDITIONS)
# structural element names that are no registration (BT.CPP registers "SubTree")
RESERVED_NODE_IDS = frozenset({"SubTree", "BehaviorTree", "root", "Root", "TreeNodesModel",
                               "Action", "Condition", "Control", "Decorator"})
V3_WRAPPERS = ("Action", "Condition", "Control", "Decorator")
# editor metadata: kept for the round trip, no effect on the tree
METADATA = frozenset({"_description", "_uid", "_fullpath"})
_PORT_NAME = re.compile(r"^[A-Za-z][^ \t\n\r<>&\"'/\\:*?|.]*$")
_INT = re.compile(r"^-?[0-9]+$")
_REAL = re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$")


def is_port_attribute(name: str) -> bool:
    """BT.CPP's IsAllowedPortName: starts with a letter, no forbidden character,
    not reserved. Other attributes are not ports (and are ignored)."""
    return _PORT_NAME.match(name) is not None and name not in RESERVED_ATTRIBUTES


def subtree_literal(text: str) -> Any:
    """A SubTree literal as BT.CPP 4.10 stores it: int for an integer text
    (``"42"``), float for a real number (``"3.14"``, ``"1e3"``), else the string."""
    if _INT.match(text):
        return int(text)
    if _REAL.match(text):
        return float(text)
    return text


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {'children' if noun == 'child' else noun + 's'}"


def _error_at(el: Element) -> Callable[..., TreeLoadError]:
    def make(kind: type[TreeLoadError], problem: str) -> TreeLoadError:
        return kind(problem, source=el.source, line=el.line, node=el.describe())

    return make


class SpecBuilder:
    """Builds the NodeSpec tree of one tree ID (SubTrees expanded).

    ``trees`` maps every tree ID the document can reach (its own, included and
    registered ones) to its ``<BehaviorTree>`` element; ``subtree_models`` the
    SubTree models; ``enums`` the scripting enums (compiled into scripts).
    """

    def __init__(self, registry: Mapping[str, Registration], trees: Mapping[str, Element],
                 subtree_models: Mapping[str, SubTreeModel], enums: Mapping[str, int | float],
                 source: str) -> None:
        self.registry = registry
        self.trees = trees
        self.subtree_models = subtree_models
        self.enums = enums
        self.source = source
        self.stack: list[str] = []
        self.used: set[str] = set()  # registration IDs used
        self.used_trees: list[str] = []  # tree IDs expanded, first use first
        self._names: list[set[str]] = []  # SubTree names per tree instance being expanded

    # ---- trees -------------------------------------------------------------------------
    def tree_root(self, tree_id: str, caller: Element | None = None) -> NodeSpec:
        el = self.trees.get(tree_id)
        if el is None:
            raise NodeConfigError(f"SubTree ID {tree_id!r} is not defined "
                                  f"(have: {', '.join(self.trees) or 'none'})",
                                  source=caller.source if caller else self.source,
                                  line=caller.line if caller else None,
                                  node=caller.describe() if caller else None)
        if tree_id in self.stack:
            cycle = " -> ".join([*self.stack[self.stack.index(tree_id):], tree_id])
            raise NodeConfigError(f"SubTree cycle: {cycle}", source=el.source,
                                  line=caller.line if caller else el.line,
                                  node=caller.describe() if caller else None)
        if len(el.children) != 1:
            raise NodeConfigError(
                f"BehaviorTree {tree_id!r} must have exactly one root node, "
                f"has {len(el.children)}", source=el.source, line=el.line)
        if tree_id not in self.used_trees:
            self.used_trees.append(tree_id)
        self.stack.append(tree_id)
        self._names.append(set())
        try:
            return self.spec(el.children[0])
        finally:
            self.stack.pop()
            self._names.pop()

    # ---- nodes -------------------------------------------------------------------------
    def verify(self, tree: Element) -> None:
        """BT.CPP's VerifyXML for one ``<BehaviorTree>``: every node of it is known and
        has a fitting number of children, every SubTree names a valid tree ID. Run on
        every tree of a document when it is loaded or registered, before ports and
        scripts are looked at (so the first error is the one BT.CPP reports)."""
        stack = list(tree.children)
        while stack:
            el = stack.pop()
            self.check_element(el)
            stack.extend(reversed(el.children))

    def check_element(self, el: Element) -> Registration | None:
        """The structural checks of one element; its registration (None for a SubTree)."""
        err = _error_at(el)
        if el.tag == "SubTree":
            tid = el.attrs.get("ID")
            if not tid:
                raise err(NodeConfigError, "<SubTree> needs an ID attribute")
            problem = model_name_problem(tid)
            if problem is not None:
                raise err(NodeConfigError, problem)
            if tid in self.registry or tid in RESERVED_NODE_IDS:
                raise err(NodeConfigError, f"SubTree ID {tid!r} is the ID of a registered node, "
                                           "not of a tree")
            if el.children:
                raise err(NodeConfigError, "<SubTree> takes no children (its content is the "
                                           f"BehaviorTree {tid!r})")
            return None
        if el.tag in V3_WRAPPERS and el.fn is None:
            reg_id = el.attrs.get("ID")
            if not reg_id:
                raise err(NodeConfigError, f"<{el.tag}> needs an ID attribute")
        else:
            reg_id = el.tag
        reg = _inline_registration(reg_id, el.fn, el) if el.fn is not None else \
            self.registry.get(reg_id)
        if reg is None:
            close = difflib.get_close_matches(reg_id, list(self.registry), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            if reg_id in self.trees:
                hint = f" ({reg_id!r} is a tree: use <SubTree ID=\"{reg_id}\"/>)"
            raise err(NodeConfigError, f"unknown node ID {reg_id!r}{hint}")
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
        if reg_id == "ReactiveSequence":
            n_async = sum(1 for c in el.children if c.tag == "AsyncSequence")
            if n_async > 1:
                raise err(NodeConfigError,
                          f"ReactiveSequence has {n_async} AsyncSequence children; it may have "
                          "one (each would restart the other, so neither could finish)")
        return reg

    def spec(self, el: Element) -> NodeSpec:
        if el.tag == "SubTree":
            return self.subtree_spec(el)
        err = _error_at(el)
        reg = self.check_element(el)
        assert reg is not None
        reg_id = reg.id
        if el.fn is None:
            self.used.add(reg_id)
        cls = reg.cls
        n = len(el.children)
        children = tuple(self.spec(c) for c in el.children)
        declared = reg.ports_for(n)
        name = el.attrs.get("name") or reg_id
        bindings, scripts = self.bind(el, declared, cls, err)
        literals = {k: b.value for k, b in bindings.items() if b.key is None}
        check = getattr(cls, "check_config", None)
        if check is not None:
            problem = check(n, literals)
            if problem:
                raise err(NodeConfigError, problem)
        if any(a in GUARD_ATTRS for a in scripts):
            cls = guarded_class(cls)
        async_with = getattr(cls, "async_with", None)
        is_async = (reg.is_async or any(c.is_async for c in children)
                    or (async_with is not None and async_with(literals)))
        return NodeSpec(id=reg_id, name=name, cls=cls, children=children, bindings=bindings,
                        port_decls=declared, scripts=scripts, fn=reg.fn, attrs=dict(el.attrs),
                        is_async=is_async, source=el.source, line=el.line, enums=self.enums)

    def bind(self, el: Element, declared: dict[str, Port], cls: type[TreeNode],
             err: Callable[..., TreeLoadError]) -> tuple[dict[str, Binding], dict[str, Any]]:
        """Port bindings and compiled scripts of one element (see the module docstring)."""
        bindings: dict[str, Binding] = {}
        scripts: dict[str, Any] = {}
        script_ports = getattr(cls, "script_ports", ())
        for attr, raw in el.attrs.items():
            if attr == "name" or attr in METADATA or (attr == "ID" and el.tag in V3_WRAPPERS):
                continue
            if attr in GUARD_ATTRS:
                scripts[attr] = self.compile(raw, attr, err)
                continue
            port = declared.get(attr)
            if port is None:
                _check_misspelt_special(attr, err)
                if not is_port_attribute(attr):
                    continue  # not a port name: BT.CPP ignores it
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
                scripts[attr] = self.compile(value, attr, err)
            text = raw if isinstance(raw, str) else literal_text(raw)  # as the XML will read
            bindings[attr] = Binding(port, None, value, text, False)
        for pname, port in declared.items():
            if pname in bindings or not port.is_input:
                continue
            if port.required:
                raise err(PortError, f"missing required input port {pname!r}"
                                     + (f" ({type_name(port.type)})" if port.type else ""))
            bindings[pname] = Binding(port, None, port.default, None, True)
        return bindings, scripts

    def compile(self, source: Any, attr: str, err: Callable[..., TreeLoadError]) -> Any:
        from .script import ScriptError, compile_script

        if not isinstance(source, str):
            raise err(NodeConfigError, f"{attr}: a script must be a string, not {source!r}")
        try:
            return compile_script(source, self.enums)
        except ScriptError as e:
            raise err(NodeConfigError, f"{attr}: {e}") from None

    # ---- SubTree ---------------------------------------------------------------------
    def subtree_spec(self, el: Element) -> NodeSpec:
        err = _error_at(el)
        self.check_element(el)
        tid = el.attrs["ID"]
        explicit_name = el.attrs.get("name")
        if explicit_name:
            names = self._names[-1] if self._names else set()
            if explicit_name in names:
                raise err(NodeConfigError,
                          f"two SubTrees named {explicit_name!r} in tree {self.stack[-1]!r}: "
                          "give them different names (or none)")
            names.add(explicit_name)
        autoremap = False
        scripts: dict[str, Any] = {}
        given: dict[str, str] = {}
        for attr, raw in el.attrs.items():
            if attr in ("ID", "name") or attr in METADATA:
                continue
            if attr == "_autoremap":
                try:
                    autoremap = (raw if isinstance(raw, bool)
                                 else convert_from_string(str(raw), bool))
                except ValueError:
                    raise err(NodeConfigError, f"_autoremap must be true or false, not {raw!r}")\
                        from None
                continue
            if attr in GUARD_ATTRS:
                scripts[attr] = self.compile(raw, attr, err)
                continue
            _check_misspelt_special(attr, err)
            if not is_port_attribute(attr):
                continue  # BT.CPP ignores attributes that are not port names
            given[attr] = raw
        model = self.subtree_models.get(tid)
        if model is not None and not autoremap:
            for pname, mport in model.ports.items():
                if pname in given:
                    continue
                if mport.default is None:
                    raise err(PortError,
                              f"the <TreeNodesModel> of SubTree {tid!r} declares port {pname!r} "
                              "without a default, and this SubTree does not set it")
                given[pname] = mport.default
        remap: dict[str, str] = {}
        values: dict[str, Any] = {}
        for attr, raw in given.items():
            try:
                key = blackboard_key(raw, attr)
            except ValueError as e:
                raise err(PortError, f"port {attr!r}: {e}") from None
            if key is not None:
                remap[attr] = key
            else:
                values[attr] = subtree_literal(raw) if isinstance(raw, str) else raw
        child = self.tree_root(tid, el)
        cls = guarded_class(SubTree) if scripts else SubTree
        return NodeSpec(id="SubTree", name=explicit_name or tid, cls=cls,
                        children=(child,), scripts=scripts, attrs=dict(el.attrs),
                        is_async=child.is_async,
                        subtree=SubTreeInfo(tid, remap, values, autoremap),
                        source=el.source, line=el.line, enums=self.enums)


_SPECIAL_BY_LOWER = {a.lower(): a for a in (*GUARD_ATTRS, "_autoremap")}


def _check_misspelt_special(attr: str, err: Callable[..., TreeLoadError]) -> None:
    """``_skipif`` for ``_skipIf``: BT.CPP would ignore it silently (and the guard would
    never run); refused here, naming the attribute meant."""
    meant = _SPECIAL_BY_LOWER.get(attr.lower())
    if meant is not None and meant != attr:
        raise err(NodeConfigError, f"unknown special attribute {attr!r} (did you mean {meant!r}?)")


def _inline_registration(reg_id: str, fn: Any, el: Element) -> Registration:
    """Builder leaves given a function instead of a registered ID."""
    from .factory import Registration

    if isinstance(fn, type) and issubclass(fn, TreeNode):
        return Registration(reg_id, fn, tuple(normalize_ports(fn.ports).values()),
                            is_async=fn.is_async)
    ports = tuple(normalize_ports(el.ports).values())
    if el.kind == "condition":
        return Registration(reg_id, FunctionCondition, ports, fn=fn)
    import inspect

    if inspect.iscoroutinefunction(fn):
        return Registration(reg_id, AsyncAction, ports, fn=fn, is_async=True)
    return Registration(reg_id, FunctionAction, ports, fn=fn)
