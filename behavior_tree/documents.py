"""BT.CPP v4 XML documents: the ``<root>`` level, ``<include>``, names and SubTree models.

:func:`read_document` turns parsed XML into a :class:`Document`: its
``<BehaviorTree>`` elements by ID, its ``<TreeNodesModel>`` entries, and the
documents it includes, read recursively. The checks are BT.CPP 4.10's
(``XMLParser::loadDocImpl`` and ``VerifyXML``), each error naming the file, the
line and the element:

* the document element is ``<root>``; ``BTCPP_format``, when given, is ``"4"``;
* a ``<BehaviorTree>`` without ``ID`` is allowed only as the single element under
  ``<root>``; it is named ``BehaviorTree_<n>`` (n counts such trees per factory);
* tree IDs and SubTree IDs are valid model names (no space, ``.``, ``/``, ``:``,
  ... and not ``Root``/``root``) and are not the ID of a registered node;
* at most one ``<TreeNodesModel>``; its entries have an ``ID``; SubTree model ports
  have valid port names;
* ``<include path="..."/>`` reads another document first. A relative path is
  relative to the including file. The resolved file must lie inside
  ``include_root`` (the folder the caller allows; by default the folder of the
  file being loaded), and a file that includes itself, directly or through
  others, is an error naming the cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .definition import Element
from .errors import XMLFormatError

__all__ = [
    "Document",
    "SubTreeModel",
    "model_name_problem",
    "port_name_problem",
    "read_document",
]

# BT.CPP's findForbiddenChar: characters that break XML, paths or Groot2
_FORBIDDEN = frozenset(" \t\n\r<>&\"'/\\:*?|.")
# attributes that are never ports (BT.CPP's IsReservedAttribute)
RESERVED_ATTRIBUTES = frozenset({
    "name", "ID", "_autoremap", "_failureIf", "_successIf", "_skipIf", "_while",
    "_onSuccess", "_onFailure", "_onHalted", "_post",
})


def _forbidden(name: str) -> str | None:
    for c in name:
        if c in _FORBIDDEN or ord(c) < 32 or ord(c) == 127:
            return repr(c) if ord(c) >= 32 else f"control character (ASCII {ord(c)})"
    return None


def model_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a tree or node type ID (None if it can)."""
    if not name:
        return "a tree or node type ID cannot be empty"
    if name in ("Root", "root"):
        return f"{name!r} is a reserved name and cannot be used as a tree or node type ID"
    bad = _forbidden(name)
    return None if bad is None else f"ID {name!r} contains the forbidden character {bad}"


def port_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a port name (None if it can)."""
    if not name:
        return "a port name cannot be empty"
    if name[0].isdigit():
        return f"port name {name!r} cannot start with a digit"
    bad = _forbidden(name)
    if bad is not None:
        return f"port name {name!r} contains the forbidden character {bad}"
    if name in RESERVED_ATTRIBUTES:
        return f"port name {name!r} is a reserved attribute name"
    return None


@dataclass(frozen=True)
class ModelPort:
    """One port of a SubTree model: direction ("input", "output", "inout") and the
    default text (``None``: no default, the SubTree must set it)."""

    name: str
    direction: str
    default: str | None
    line: int | None


@dataclass(frozen=True)
class SubTreeModel:
    """``<TreeNodesModel><SubTree ID=...>``: the ports a SubTree declares."""

    tree_id: str
    ports: dict[str, ModelPort]
    source: str
    line: int | None


@dataclass
class Document:
    """One parsed document: trees by ID (document order), models, includes."""

    source: str
    path: Path | None
    root: Element
    trees: dict[str, Element] = field(default_factory=dict)
    models: dict[str, Element] = field(default_factory=dict)
    subtree_models: dict[str, SubTreeModel] = field(default_factory=dict)
    includes: list[Document] = field(default_factory=list)

    @property
    def main_tree(self) -> str | None:
        """``main_tree_to_execute``, if the document says."""
        return self.root.attrs.get("main_tree_to_execute") or None

    def all_documents(self) -> list[Document]:
        """Included documents first (depth-first, in include order), then this one."""
        out: list[Document] = []
        for inc in self.includes:
            out.extend(inc.all_documents())
        out.append(self)
        return out


class _Reader:
    def __init__(self, parse: Callable[[str, str], Element], is_node_id: Callable[[str], bool],
                 lone_name: Callable[[], str], include_root: Path | None) -> None:
        self.parse = parse
        self.is_node_id = is_node_id
        self.lone_name = lone_name
        self.include_root = include_root
        self.stack: list[Path] = []

    def read(self, root: Element, source: str, path: Path | None) -> Document:
        def err(problem: str, el: Element | None = None) -> XMLFormatError:
            node = el.describe() if el is not None else f"<{root.tag}>"
            return XMLFormatError(problem, source=source,
                                  line=(el or root).line, node=node)

        if root.tag != "root":
            raise err(f"the document element must be <root>, not <{root.tag}>")
        fmt = root.attrs.get("BTCPP_format")
        if fmt is not None and fmt != "4":
            raise err(f'BTCPP_format="{fmt}" is not supported (only "4")')
        doc = Document(source, path, root)
        n_elements = len(root.children)
        seen_models = False
        for el in root.children:
            if el.tag == "include":
                doc.includes.append(self.include(el, source, path))
            elif el.tag == "TreeNodesModel":
                if seen_models:
                    raise err("only one <TreeNodesModel> is allowed per document", el)
                seen_models = True
                self.models(el, doc, err)
        for el in root.children:
            if el.tag == "BehaviorTree":
                self.tree(el, doc, n_elements, err)
            elif el.tag not in ("include", "TreeNodesModel"):
                raise err(f"unexpected <{el.tag}> under <root> (expected <BehaviorTree>, "
                          "<TreeNodesModel> or <include>)", el)
        return doc

    def tree(self, el: Element, doc: Document, n_elements: int,
             err: Callable[..., XMLFormatError]) -> None:
        tid = el.attrs.get("ID")
        if tid is None or tid == "":
            if n_elements > 1:
                raise err("<BehaviorTree> needs an ID attribute when <root> holds more than "
                          "one element (only a lone tree may go without one)", el)
            tid = self.lone_name()
        else:
            problem = model_name_problem(tid)
            if problem is not None:
                raise err(problem, el)
            if self.is_node_id(tid):
                raise err(f"BehaviorTree ID {tid!r} is the ID of a registered node; "
                          "rename the tree", el)
        if tid in doc.trees:
            raise err(f"BehaviorTree ID {tid!r} defined twice", el)
        if len(el.children) != 1:
            raise err(f"BehaviorTree {tid!r} must have exactly one root node, has "
                      f"{len(el.children)}", el)
        doc.trees[tid] = el

    def models(self, models_el: Element, doc: Document,
               err: Callable[..., XMLFormatError]) -> None:
        for m in models_el.children:
            mid = m.attrs.get("ID")
            if not mid:
                raise err(f"<{m.tag}> in <TreeNodesModel> needs an ID attribute", m)
            doc.models[mid] = m
            if m.tag != "SubTree":
                continue
            ports: dict[str, ModelPort] = {}
            for p in m.children:
                direction = {"input_port": "input", "output_port": "output",
                             "inout_port": "inout"}.get(p.tag)
                if direction is None:
                    continue
                pname = p.attrs.get("name")
                if pname is None:
                    raise err(f"<{p.tag}> of SubTree model {mid!r} needs a name attribute", p)
                problem = port_name_problem(pname)
                if problem is not None:
                    raise err(f"SubTree model {mid!r}: {problem}", p)
                ports[pname] = ModelPort(pname, direction, p.attrs.get("default"), p.line)
            doc.subtree_models[mid] = SubTreeModel(mid, ports, doc.source, m.line)

    def include(self, el: Element, source: str, path: Path | None) -> Document:
        def err(problem: str) -> XMLFormatError:
            return XMLFormatError(problem, source=source, line=el.line, node="include")

        raw = el.attrs.get("path")
        if not raw:
            raise err('<include> needs a path attribute (<include path="other.xml"/>)')
        if "ros_pkg" in el.attrs:
            raise err("<include ros_pkg=...> needs ROS; give a path relative to this file")
        base = path.parent if path is not None else self.include_root
        if base is None or self.include_root is None:
            raise err(f"<include path={raw!r}> in XML text: pass include_root= (the folder "
                      "included files may be read from)")
        target = Path(raw)
        if not target.is_absolute():
            target = base / target
        real = target.resolve()
        allowed = self.include_root.resolve()
        if not real.is_relative_to(allowed):
            raise err(f"<include path={raw!r}> resolves to {real}, outside {allowed}, the "
                      "folder included files may be read from (pass include_root= to allow "
                      "a wider one)")
        if real in self.stack:
            chain = " -> ".join(p.name for p in self.stack[self.stack.index(real):])
            raise err(f"include cycle: {chain} -> {real.name}")
        try:
            text = real.read_text(encoding="utf-8")
        except OSError as e:
            raise err(f"<include path={raw!r}>: cannot read {real}: {e.strerror}") from None
        self.stack.append(real)
        try:
            return self.read(self.parse(text, str(real)), str(real), real)
        finally:
            self.stack.pop()


def read_document(root: Element, source: str, *, path: Path | None,
                  include_root: Path | None, parse: Callable[[str, str], Element],
                  is_node_id: Callable[[str], bool], lone_name: Callable[[], str]) -> Document:
    """Check a parsed document and read its includes (see the module docstring).

    ``path`` is the file the document came from (None for text), ``include_root``
    the folder included files must lie in (None: the folder of ``path``; text
    without one cannot include). ``is_node_id`` says whether an ID is a registered
    node type; ``lone_name`` names a ``<BehaviorTree>`` that has no ID.
    """
    if include_root is None and path is not None:
        include_root = path.resolve().parent
    reader = _Reader(parse, is_node_id, lone_name, include_root)
    if path is not None:
        reader.stack.append(path.resolve())
    return reader.read(root, source, path)
