"""Exceptions raised by the behavior_tree package.

Every load-time error names where the problem is: the XML file (or
``<string>``), the line, the node (its name and registration ID) and what is
wrong with it.
"""

from __future__ import annotations

__all__ = [
    "BehaviorTreeError",
    "BlackboardError",
    "BlackboardTypeError",
    "NodeConfigError",
    "PortError",
    "TreeLoadError",
    "XMLFormatError",
]


class BehaviorTreeError(Exception):
    """Base class of every error raised by behavior_tree."""


class TreeLoadError(BehaviorTreeError):
    """A tree definition cannot be built (XML, builder or factory input).

    ``source`` is the file name (``"<string>"`` for XML text), ``line`` the
    1-based line or None, ``node`` a short description of the node or None.
    """

    def __init__(
        self,
        problem: str,
        *,
        source: str | None = None,
        line: int | None = None,
        node: str | None = None,
    ) -> None:
        self.problem = problem
        self.source = source
        self.line = line
        self.node = node
        where = []
        if source is not None:
            where.append(source if line is None else f"{source}:{line}")
        elif line is not None:
            where.append(f"line {line}")
        if node is not None:
            where.append(f"node {node}")
        super().__init__(f"{', '.join(where)}: {problem}" if where else problem)


class XMLFormatError(TreeLoadError):
    """Malformed XML, forbidden DOCTYPE/entities, or a structure that is not BT.CPP v4."""


class NodeConfigError(TreeLoadError):
    """Unknown node ID, wrong number of children, bad attributes, SubTree cycles, ..."""


class PortError(NodeConfigError):
    """A port is missing, unknown, or its literal does not convert to the port's type."""


class BlackboardError(BehaviorTreeError, KeyError):
    """A blackboard key is missing (also a KeyError, so ``except KeyError`` works)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class BlackboardTypeError(BehaviorTreeError, TypeError):
    """A write does not match the type the key was fixed to."""
