"""Render a tree as a Graphviz DOT digraph or a Mermaid flowchart.

Both renderers accept a running :class:`~behavior_tree.tree.Tree` (nodes are
filled with the colour of their live status), a
:class:`~behavior_tree.definition.TreeDefinition` (no status: white nodes), or
the root node / root spec of either. Each node is labelled with its name and,
when the two differ, its registration ID; its shape says what kind of node it
is:

=========  ==============================  ==========================
kind       DOT shape                       Mermaid shape
=========  ==============================  ==========================
control    rounded box                     subroutine ``[[ ]]``
decorator  hexagon                         hexagon ``{{ }}``
condition  ellipse                         stadium ``([ ])``
action     box                             rectangle ``[ ]``
subtree    box3d                           parallelogram ``[/ /]``
=========  ==============================  ==========================

Colours: IDLE grey, RUNNING orange, SUCCESS green, FAILURE red, SKIPPED
light blue. A node's status between ticks is what BT.CPP leaves there: a
parent resets its children to IDLE when it completes. To show what every node
*returned* during the last tick instead, pass
``statuses=statuses_from_trace(trace.records[-1])``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .status import Status

__all__ = [
    "STATUS_COLORS",
    "render",
    "statuses_from_trace",
    "to_dot",
    "to_mermaid",
]

STATUS_COLORS: dict[Status, str] = {
    Status.IDLE: "#d9d9d9",
    Status.RUNNING: "#ffb347",
    Status.SUCCESS: "#77dd77",
    Status.FAILURE: "#ff6961",
    Status.SKIPPED: "#add8e6",
}
_STROKES: dict[Status, str] = {
    Status.IDLE: "#8c8c8c",
    Status.RUNNING: "#c77800",
    Status.SUCCESS: "#2e8b2e",
    Status.FAILURE: "#b22222",
    Status.SKIPPED: "#4682b4",
}
_NO_STATUS_FILL = "#ffffff"

_DOT_SHAPES = {
    "control": ("box", "rounded,filled"),
    "decorator": ("hexagon", "filled"),
    "condition": ("ellipse", "filled"),
    "action": ("box", "filled"),
    "subtree": ("box3d", "filled"),
}
_MERMAID_SHAPES = {
    "control": ("[[", "]]"),
    "decorator": ("{{", "}}"),
    "condition": ("([", "])"),
    "action": ("[", "]"),
    "subtree": ("[/", "/]"),
}


class _Item:
    """One node as the renderers see it."""

    __slots__ = ("children", "id", "index", "kind", "name", "ports", "status")

    def __init__(self, index: int, node: Any, status: Status | None, show_ports: bool) -> None:
        self.index = index
        self.name: str = node.name
        self.id: str = node.id
        self.kind: str = node.kind
        self.status = status
        self.children: list[int] = []
        self.ports: dict[str, str] = {}
        if show_ports:
            bindings = (
                node.port_bindings() if hasattr(node, "port_bindings") else node.port_strings()
            )
            self.ports = dict(bindings)

    def label_lines(self) -> list[str]:
        lines = [self.name] if self.name == self.id else [self.name, f"({self.id})"]
        lines.extend(f"{k}={v}" for k, v in sorted(self.ports.items()))
        return lines


def _items(
    tree_or_definition: Any,
    statuses: Mapping[int, Status] | None,
    show_ports: bool,
) -> list[_Item]:
    root = getattr(tree_or_definition, "root", tree_or_definition)
    if not (hasattr(root, "children") and hasattr(root, "kind") and hasattr(root, "id")):
        raise TypeError(
            "expected a Tree, a TreeDefinition or a tree node, got "
            f"{type(tree_or_definition).__name__}"
        )
    live = hasattr(root, "status")  # instantiated nodes carry a status, definition specs do not
    items: list[_Item] = []

    def visit(node: Any) -> int:
        index = len(items)
        status = None
        if live or statuses is not None:
            status = node.status if live else None
            if statuses is not None:
                status = statuses.get(getattr(node, "uid", index), status)
        item = _Item(index, node, status, show_ports)
        items.append(item)
        item.children = [visit(child) for child in node.children]
        return index

    visit(root)
    return items


def _edges(items: list[_Item]) -> Iterator[tuple[int, int]]:
    for item in items:
        for child in item.children:
            yield item.index, child


def statuses_from_trace(record: Any) -> dict[int, Status]:
    """``uid -> status`` each node *returned* during one traced tick.

    ``record`` is a :class:`~behavior_tree.trace.TickRecord`. The resets to
    IDLE that parents do at the end of a tick are ignored, so a node that
    returned SUCCESS and was then reset shows as SUCCESS; SKIPPED nodes show as
    SKIPPED. Nodes not ticked keep the status they have.
    """
    out: dict[int, Status] = {}
    for transition in record.transitions:
        if transition.new is not Status.IDLE:
            out[transition.uid] = transition.new
    return out


# --------------------------------------------------------------------------- DOT


def _dot_quote(text: str) -> str:
    """A DOT double-quoted string; ``\\n`` in the result is DOT's centred line break."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "")
    return escaped.replace("\n", "\\n")


def to_dot(
    tree_or_definition: Any,
    *,
    statuses: Mapping[int, Status] | None = None,
    show_ports: bool = False,
    title: str | None = None,
) -> str:
    """Graphviz DOT source for the tree (``dot -Tsvg tree.dot > tree.svg``)."""
    items = _items(tree_or_definition, statuses, show_ports)
    name = (
        title
        or getattr(getattr(tree_or_definition, "definition", tree_or_definition), "main_tree", None)
        or items[0].name
    )
    lines = [
        f'digraph "{_dot_quote(name)}" {{',
        '  graph [rankdir=TB, ordering=out, fontname="Helvetica"];',
        '  node [fontname="Helvetica", fontsize=10, penwidth=1.2];',
        '  edge [arrowhead=none, color="#555555"];',
    ]
    for item in items:
        shape, style = _DOT_SHAPES.get(item.kind, ("box", "filled"))
        label = "\n".join(item.label_lines())
        fill = _NO_STATUS_FILL if item.status is None else STATUS_COLORS[item.status]
        attrs = [
            f'label="{_dot_quote(label)}"',
            f"shape={shape}",
            f'style="{style}"',
            f'fillcolor="{fill}"',
        ]
        if item.status is not None:
            attrs.append(f'color="{_STROKES[item.status]}"')
            attrs.append(f'tooltip="{item.status.name}"')
        lines.append(f"  n{item.index} [{', '.join(attrs)}];")
    lines.extend(f"  n{parent} -> n{child};" for parent, child in _edges(items))
    lines.append("}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- Mermaid

_MERMAID_ENTITIES = {
    "#": "#35;",  # first: the escapes below start with '#'
    "&": "#amp;",
    '"': "#quot;",
    "<": "#lt;",
    ">": "#gt;",
    "`": "#96;",
}


def _mermaid_text(text: str) -> str:
    """Escape one label line for a double-quoted Mermaid label."""
    return "".join(_MERMAID_ENTITIES.get(c, c) for c in text.replace("\r", ""))


def to_mermaid(
    tree_or_definition: Any,
    *,
    statuses: Mapping[int, Status] | None = None,
    show_ports: bool = False,
    direction: str = "TD",
) -> str:
    """A Mermaid ``flowchart`` of the tree (paste into a Markdown ```mermaid block)."""
    if direction not in ("TD", "TB", "BT", "LR", "RL"):
        raise ValueError(f"direction must be one of TD, TB, BT, LR, RL, not {direction!r}")
    items = _items(tree_or_definition, statuses, show_ports)
    lines = [f"flowchart {direction}"]
    for item in items:
        opening, closing = _MERMAID_SHAPES.get(item.kind, ("[", "]"))
        label = "<br/>".join(
            _mermaid_text(line) for text in item.label_lines() for line in text.split("\n")
        )
        lines.append(f'    n{item.index}{opening}"{label}"{closing}')
    lines.extend(f"    n{parent} --> n{child}" for parent, child in _edges(items))
    by_status: dict[Status, list[str]] = {}
    for item in items:
        if item.status is not None:
            by_status.setdefault(item.status, []).append(f"n{item.index}")
    for status in Status:  # enum order: output does not depend on the walk
        if status in by_status:
            lines.append(
                f"    classDef {status.name.lower()} fill:{STATUS_COLORS[status]},"
                f"stroke:{_STROKES[status]},color:#000000"
            )
            lines.append(f"    class {','.join(by_status[status])} {status.name.lower()}")
    return "\n".join(lines) + "\n"


def render(tree_or_definition: Any, format: str = "mermaid", **options: Any) -> str:
    """``to_dot`` or ``to_mermaid`` by name (``"dot"`` / ``"mermaid"``)."""
    if format == "dot":
        return to_dot(tree_or_definition, **options)
    if format == "mermaid":
        return to_mermaid(tree_or_definition, **options)
    raise ValueError(f"unknown format {format!r} (expected 'dot' or 'mermaid')")
