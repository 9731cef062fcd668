"""Reading and writing BehaviorTree.CPP v4 XML.

Parsing uses ``xml.parsers.expat`` directly: any DOCTYPE (hence any entity
declaration, internal or external) is rejected, so there is no entity
expansion and nothing is fetched. Every element records its line, so errors
name the file, the line and the node. What tinyxml2 (BT.CPP's parser) tolerates
and expat does not (``code="a<b && c"``) is repaired first, see :func:`tolerant_text`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any
from xml.parsers import expat

from .definition import Element
from .errors import XMLFormatError

if TYPE_CHECKING:
    from .definition import TreeDefinition

__all__ = ["definition_to_xml", "element_to_xml", "literal_text", "parse_xml", "tolerant_text"]


def parse_xml(text: str | bytes, source: str = "<string>") -> Element:
    """Parse XML text into an :class:`Element` tree.

    Text content is ignored (as tinyxml2 does for BT.CPP), except the port
    descriptions Groot2 writes inside ``<TreeNodesModel>``. A document expat refuses
    is read again after :func:`tolerant_text` repairs what tinyxml2 tolerates (a bare
    ``<`` or ``&`` inside an attribute value, text or an XML declaration before the
    document element); if that does not parse either, the original error is raised.
    """
    try:
        return _parse(text, source)
    except XMLFormatError as strict_error:
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError:
                raise strict_error from None
        repaired = tolerant_text(text)
        if repaired == text:
            raise
        try:
            return _parse(repaired, source)
        except XMLFormatError:
            raise strict_error from None


def _parse(text: str | bytes, source: str) -> Element:
    parser = expat.ParserCreate()
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    stack: list[Element] = []
    root: list[Element] = []
    in_models = [0]  # depth inside <TreeNodesModel>

    def fail(problem: str) -> None:
        raise XMLFormatError(problem, source=source, line=parser.CurrentLineNumber)

    def start(tag: str, attrs: dict[str, str]) -> None:
        el = Element(tag, dict(attrs), [], parser.CurrentLineNumber, source)
        if stack:
            stack[-1].children.append(el)
        else:
            root.append(el)
        stack.append(el)
        if tag == "TreeNodesModel" or in_models[0]:
            in_models[0] += 1

    def end(tag: str) -> None:
        el = stack.pop()
        if in_models[0]:
            in_models[0] -= 1
        if el.text:
            el.text = el.text.strip() if not el.children else ""

    def chardata(data: str) -> None:
        if in_models[0] and stack:  # Groot2 port descriptions
            stack[-1].text += data

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
        hint = ""
        if e.code in (expat.errors.codes[expat.errors.XML_ERROR_INVALID_TOKEN],
                      expat.errors.codes[expat.errors.XML_ERROR_TAG_MISMATCH]):
            hint = ("; inside attribute values write < as &lt; and & as &amp;"
                    if e.code == expat.errors.codes[expat.errors.XML_ERROR_INVALID_TOKEN]
                    else "; check that every element is closed")
        raise XMLFormatError(
            f"malformed XML: {expat.ErrorString(e.code)} (column {e.offset + 1}){hint}",
            source=source, line=e.lineno,
        ) from None
    if not root:
        raise XMLFormatError("empty document", source=source)
    return root[0]


_ENTITY_REF = re.compile(r"&(?:[A-Za-z_][\w.-]*|#[0-9]+|#x[0-9A-Fa-f]+);")


def tolerant_text(text: str) -> str:
    """What tinyxml2 reads, as well-formed XML with the same line numbers.

    Inside attribute values a bare ``<`` becomes ``&lt;`` and an ``&`` that starts no
    entity reference becomes ``&amp;`` (``code="a<b && c"``); text outside the
    document element and an XML declaration that does not open the document are
    blanked out. Comments, processing instructions, CDATA and everything else are
    copied unchanged, so a document that is wrong in another way stays wrong.
    """
    out: list[str] = []
    i, n, depth = 0, len(text), 0
    while i < n:
        c = text[i]
        if c != "<":
            j = text.find("<", i)
            j = n if j < 0 else j
            chunk = text[i:j]
            out.append(chunk if depth else re.sub(r"[^\n]", " ", chunk))
            i = j
            continue
        for opener, closer in (("<!--", "-->"), ("<![CDATA[", "]]>"), ("<?", "?>")):
            if text.startswith(opener, i):
                j = text.find(closer, i)
                j = n if j < 0 else j + len(closer)
                chunk = text[i:j]
                if opener == "<?" and chunk[2:5].lower() == "xml" and i != 0:
                    chunk = re.sub(r"[^\n]", " ", chunk)  # a declaration not at the start
                out.append(chunk)
                i = j
                break
        else:
            i, depth = _copy_tag(text, i, depth, out)
    return "".join(out)


def _copy_tag(text: str, i: int, depth: int, out: list[str]) -> tuple[int, int]:
    """Copy the tag starting at ``text[i] == '<'``, escaping inside quoted values."""
    n = len(text)
    closing = text.startswith("</", i)
    j = i + 1
    quote = ""
    buf = ["<"]
    while j < n:
        c = text[j]
        if quote:
            if c == quote:
                quote = ""
                buf.append(c)
            elif c == "<":
                buf.append("&lt;")
            elif c == "&" and not _ENTITY_REF.match(text, j):
                buf.append("&amp;")
            else:
                buf.append(c)
        elif c in "\"'":
            quote = c
            buf.append(c)
        elif c == ">":
            buf.append(c)
            j += 1
            break
        elif c == "<":  # a new tag before this one closed: leave it to the parser
            break
        else:
            buf.append(c)
        j += 1
    out.append("".join(buf))
    tag = "".join(buf)
    if closing:
        depth -= 1
    elif not tag.endswith("/>") and not tag.startswith("<!"):
        depth += 1
    return j, depth


def _escape(value: str) -> str:
    return (value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("\n", "&#10;").replace("\t", "&#9;"))


def literal_text(value: Any) -> str:
    """How a literal value is written in XML (``true``/``false``, status names)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "name") and type(value).__name__ == "Status":
        return value.name
    return str(value)


def element_to_xml(el: Element, indent: int = 0, step: str = "  ") -> list[str]:
    """Lines of XML for ``el`` and its children (attributes in their given order)."""
    pad = step * indent
    attrs = "".join(f' {k}="{_escape(literal_text(v))}"' for k, v in el.attrs.items())
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
