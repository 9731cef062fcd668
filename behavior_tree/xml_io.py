"""Reading and writing BehaviorTree.CPP v4 XML.

Parsing uses ``xml.parsers.expat`` directly: any DOCTYPE (hence any entity
declaration, internal or external) is rejected, so there is no entity
expansion and nothing is fetched. Every element records its line, so errors
name the file, the line and the node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from xml.parsers import expat

from .definition import Element
from .errors import XMLFormatError

if TYPE_CHECKING:
    from .definition import TreeDefinition

__all__ = ["definition_to_xml", "element_to_xml", "parse_xml"]


def parse_xml(text: str | bytes, source: str = "<string>") -> Element:
    """Parse XML text into an :class:`Element` tree (whitespace text dropped)."""
    parser = expat.ParserCreate()
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    stack: list[Element] = []
    root: list[Element] = []

    def fail(problem: str) -> None:
        raise XMLFormatError(problem, source=source, line=parser.CurrentLineNumber)

    def start(tag: str, attrs: dict[str, str]) -> None:
        el = Element(tag, dict(attrs), [], parser.CurrentLineNumber, source)
        if stack:
            stack[-1].children.append(el)
        else:
            root.append(el)
        stack.append(el)

    def end(tag: str) -> None:
        el = stack.pop()
        if el.text:
            el.text = el.text.strip() if not el.children else ""

    def chardata(data: str) -> None:
        if any(el.tag == "TreeNodesModel" for el in stack):  # Groot2 port descriptions
            stack[-1].text += data
            return
        if not data.strip():
            return
        where = stack[-1].tag if stack else "document"
        fail(f"unexpected text {data.strip()[:40]!r} inside <{where}>")

    def doctype(name: str, sysid: str | None, pubid: str | None, has_internal: int) -> None:
        fail("DOCTYPE declarations are not allowed (no entities, no external references)")

    def entity(*args: Any) -> None:
        fail("entity declarations are not allowed")

    def external(*args: Any) -> int:
        fail("external entities are not allowed")
        return 0

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = chardata
    parser.StartDoctypeDeclHandler = doctype
    parser.EntityDeclHandler = entity
    parser.UnparsedEntityDeclHandler = entity
    parser.ExternalEntityRefHandler = external
    try:
        parser.Parse(text, True)
    except expat.ExpatError as e:
        raise XMLFormatError(
            f"malformed XML: {expat.ErrorString(e.code)} (column {e.offset + 1})",
            source=source, line=e.lineno,
        ) from None
    if not root:
        raise XMLFormatError("empty document", source=source)
    return root[0]


def _escape(value: str) -> str:
    return (value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("\n", "&#10;").replace("\t", "&#9;"))


def _attr_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "name") and type(value).__name__ == "Status":
        return value.name
    return str(value)


def element_to_xml(el: Element, indent: int = 0, step: str = "  ") -> list[str]:
    """Lines of XML for ``el`` and its children (attributes in their given order)."""
    pad = step * indent
    attrs = "".join(f' {k}="{_escape(_attr_text(v))}"' for k, v in el.attrs.items())
    if el.text and not el.children:
        return [f"{pad}<{el.tag}{attrs}>{_escape(el.text)}</{el.tag}>"]
    if not el.children:
        return [f"{pad}<{el.tag}{attrs}/>"]
    lines = [f"{pad}<{el.tag}{attrs}>"]
    for c in el.children:
        lines.extend(element_to_xml(c, indent + 1, step))
    lines.append(f"{pad}</{el.tag}>")
    return lines


def definition_to_xml(definition: TreeDefinition) -> str:
    """BT.CPP v4 XML for a definition: every BehaviorTree, then the TreeNodesModel."""
    lines = ['<?xml version="1.0" encoding="UTF-8"?>',
             f'<root BTCPP_format="4" main_tree_to_execute="{_escape(definition.main_tree)}">']
    for tree_id, el in definition.trees.items():
        body = Element("BehaviorTree", {"ID": tree_id, **{k: v for k, v in el.attrs.items()
                                                            if k != "ID"}}, el.children)
        lines.extend(element_to_xml(body, 1))
    if definition.models:
        lines.append("  <TreeNodesModel>")
        for model in definition.models.values():
            lines.extend(element_to_xml(model, 2))
        lines.append("  </TreeNodesModel>")
    lines.append("</root>")
    return "\n".join(lines) + "\n"
