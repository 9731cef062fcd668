"""Reading a line book's YAML: the node walker that names file, line and field in every error, and
the sections merged over files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from runtime.factory.linebook.lint import _unknown
from runtime.factory.linebook.types import _NAME_RE, LineBookError, _Where

# ---------------------------------------------------------------- YAML node reading


class _Reader:
    """Walks a composed YAML node tree, raising LineBookError with file/line/field."""

    def __init__(self, file: str) -> None:
        self.file = file

    def where(self, node: yaml.Node, field: str) -> _Where:
        return _Where(self.file, node.start_mark.line + 1, field)

    def fail(self, node: yaml.Node, field: str, problem: str) -> LineBookError:
        return self.where(node, field).error(problem)

    def mapping(self, node: yaml.Node, field: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, field, "expected a mapping")
        out: list[tuple[str, yaml.Node, yaml.Node]] = []
        seen: set[str] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise self.fail(key_node, field, "keys must be plain names")
            key = str(key_node.value)
            if key in seen:
                raise self.fail(key_node, f"{field}.{key}", "duplicate key")
            seen.add(key)
            out.append((key, key_node, value_node))
        return out

    def seq(self, node: yaml.Node, field: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, field, "expected a list")
        return list(node.value)

    def string(self, node: yaml.Node, field: str) -> str:
        if not isinstance(node, yaml.ScalarNode) or node.tag.endswith(":null"):
            raise self.fail(node, field, "expected a string")
        value = str(node.value)
        if not value.strip():
            raise self.fail(node, field, "empty string")
        return value

    def name(self, node: yaml.Node, field: str) -> str:
        value = self.string(node, field)
        if not _NAME_RE.match(value):
            raise self.fail(node, field, f"{value!r} is not a name (lowercase letters, digits, _)")
        return value

    def names(self, node: yaml.Node, field: str) -> list[str]:
        out: list[str] = []
        for i, item in enumerate(self.seq(node, field)):
            value = self.name(item, f"{field}[{i}]")
            if value in out:
                raise self.fail(item, f"{field}[{i}]", f"duplicate name {value!r}")
            out.append(value)
        return out

    def integer(self, node: yaml.Node, field: str, lo: int, hi: int) -> int:
        if not isinstance(node, yaml.ScalarNode) or not node.tag.endswith(":int"):
            raise self.fail(node, field, "expected an integer")
        value = int(node.value)
        if not lo <= value <= hi:
            raise self.fail(node, field, f"{value} is outside [{lo}, {hi}]")
        return value



@dataclass
class _Raw:
    """Sections as read, merged over files, before cross-checks."""

    sections: dict[str, list[tuple[_Reader, str, yaml.Node, yaml.Node]]] = field(
        default_factory=dict
    )
    lists: dict[str, list[tuple[_Reader, yaml.Node]]] = field(default_factory=dict)


_MAP_SECTIONS = (
    "archetypes",
    "persona_traits",
    "states",
    "intents",
    "context",
    "replies",
    "fallbacks",
    "phrases",
    "own_lines",
    "own_replies",
    "trait_replies",
    "slot_defaults",
    "expansion",
)
_LIST_SECTIONS = ("slots", "banned_words", "compose", "heldout_pairs")
# mapping sections whose entries may be split further across files (one archetype's or trait's
# states in two files): a (name, state, intent) cell defined twice is the error, not the name
_CELL_SECTIONS = ("own_replies", "trait_replies")

# ---------------------------------------------------------------- loading


def _read_file(path: Path, raw: _Raw) -> None:
    file = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise LineBookError(file, 1, "<file>", f"not UTF-8: {exc}") from exc
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise LineBookError(file, line, "<yaml>", str(exc.problem or exc.context)) from exc
    if root is None:
        return
    rd = _Reader(file)
    for section, key, value in rd.mapping(root, "<top>"):
        if section in _MAP_SECTIONS:
            bucket = raw.sections.setdefault(section, [])
            for name, nkey, nvalue in rd.mapping(value, section):
                for other_rd, other_name, other_key, _ in bucket:
                    if other_name == name and section not in _CELL_SECTIONS:
                        raise rd.fail(
                            nkey,
                            f"{section}.{name}",
                            f"already defined at {other_rd.file}:{other_key.start_mark.line + 1}",
                        )
                bucket.append((rd, name, nkey, nvalue))
        elif section in _LIST_SECTIONS:
            rd.seq(value, section)
            raw.lists.setdefault(section, []).append((rd, value))
        else:
            raise rd.fail(
                key, section, _unknown("section", section, [*_MAP_SECTIONS, *_LIST_SECTIONS])
            )
