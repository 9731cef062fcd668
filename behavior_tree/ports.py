"""Port declarations and string-to-type conversion.

A node class declares its ports (``ports = (InputPort("goal", type=str), ...)``);
XML attributes and builder keyword arguments bind each port either to a literal
(converted to the port's type when the tree is loaded) or to a blackboard key
written ``{key}`` (``{=}`` means the key with the port's own name).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .status import Status

__all__ = [
    "NO_DEFAULT",
    "BidirectionalPort",
    "InputPort",
    "OutputPort",
    "Port",
    "PortDirection",
    "blackboard_key",
    "convert_from_string",
    "type_name",
]


class _NoDefault:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_DEFAULT"

    def __reduce__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT: Any = _NoDefault()
"""Marks a port without a default value: binding it is required."""


class PortDirection(str, Enum):
    INPUT = "input"
    OUTPUT = "output"
    INOUT = "inout"


@dataclass(frozen=True)
class Port:
    """One declared port. ``type=None`` accepts anything (strings stay strings)."""

    name: str
    direction: PortDirection = PortDirection.INPUT
    type: type | None = None
    default: Any = NO_DEFAULT
    description: str = ""

    @property
    def required(self) -> bool:
        return self.default is NO_DEFAULT

    @property
    def is_input(self) -> bool:
        return self.direction is not PortDirection.OUTPUT

    @property
    def is_output(self) -> bool:
        return self.direction is not PortDirection.INPUT


def InputPort(
    name: str, type: type | None = None, default: Any = NO_DEFAULT, description: str = ""
) -> Port:
    """A port the node reads."""
    return Port(name, PortDirection.INPUT, type, default, description)


def OutputPort(
    name: str, type: type | None = None, default: Any = NO_DEFAULT, description: str = ""
) -> Port:
    """A port the node writes. Bind it to a key with ``{key}``; writing an unbound
    output is a no-op, so outputs are never required."""
    return Port(name, PortDirection.OUTPUT, type, default, description)


def BidirectionalPort(
    name: str, type: type | None = None, default: Any = NO_DEFAULT, description: str = ""
) -> Port:
    """A port the node reads and writes."""
    return Port(name, PortDirection.INOUT, type, default, description)


def normalize_ports(ports: Iterable[Port | str] | None) -> dict[str, Port]:
    """Accept Port objects or bare names (untyped input ports); name -> Port."""
    out: dict[str, Port] = {}
    for p in ports or ():
        port = InputPort(p) if isinstance(p, str) else p
        if not isinstance(port, Port):
            raise TypeError(f"ports must be Port objects or names, not {port!r}")
        if port.name in out:
            raise ValueError(f"port {port.name!r} declared twice")
        out[port.name] = port
    return out


_KEY_RE = re.compile(r"^\s*\{\s*([^{}]*?)\s*\}\s*$")


def blackboard_key(text: Any, port_name: str) -> str | None:
    """``"{key}"`` -> ``"key"``, ``"{=}"`` -> the port name, anything else -> None.
    Spaces around the braces do not matter (``"{key}  "`` is a key, as in BT.CPP)."""
    if not isinstance(text, str):
        return None
    m = _KEY_RE.match(text)
    if m is None:
        return None
    key = m.group(1)
    if key == "=":
        return port_name
    if not key:
        raise ValueError(f"empty blackboard key {text!r}")
    return key


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}

_TYPE_NAMES: dict[type, str] = {
    int: "int",
    float: "float",
    bool: "bool",
    str: "str",
    list: "list",
    dict: "dict",
    Status: "Status",
}
_TYPES_BY_NAME = {v: k for k, v in _TYPE_NAMES.items()}


def type_name(t: type | None) -> str:
    if t is None:
        return "any"
    return _TYPE_NAMES.get(t, t.__qualname__)


def type_from_name(name: str) -> type | None:
    """Inverse of :func:`type_name` for the built-in types (``"any"`` -> None)."""
    if name == "any":
        return None
    try:
        return _TYPES_BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown type name {name!r}") from None


def convert_from_string(text: str, target: type | None) -> Any:
    """Convert an XML/string literal to ``target``; ValueError when it does not fit.

    bool accepts true/false/1/0/yes/no/on/off; int accepts decimal and 0x hex;
    list and dict accept JSON; ``Status`` accepts a status name; an Enum accepts
    a member name; other types are called with the string.
    """
    if target is None or target is str:
        return text
    s = text.strip()
    if target is bool:
        low = s.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(f"{text!r} is not a bool")
    if target is int:
        try:
            return int(s, 0) if s.lower().startswith(("0x", "-0x")) else int(s)
        except ValueError:
            raise ValueError(f"{text!r} is not an int") from None
    if target is float:
        try:
            return float(s)
        except ValueError:
            raise ValueError(f"{text!r} is not a float") from None
    if target is list or target is dict:
        try:
            value = json.loads(s)
        except ValueError:
            raise ValueError(f"{text!r} is not a JSON {type_name(target)}") from None
        if not isinstance(value, target):
            raise ValueError(f"{text!r} is not a JSON {type_name(target)}")
        return value
    if isinstance(target, type) and issubclass(target, Enum):
        try:
            return target[s]
        except KeyError:
            if issubclass(target, Status):
                return Status.parse(s)
            raise ValueError(f"{text!r} is not a {target.__qualname__} member") from None
    try:
        return target(s)
    except Exception as e:
        raise ValueError(f"{text!r} does not convert to {type_name(target)}: {e}") from None


def coerce_for_read(value: Any, target: type | None) -> Any:
    """:func:`coerce`, plus numbers read through a ``str`` port become their text (BT.CPP
    reads an int entry through an ``std::string`` port as ``"42"``)."""
    if target is str and value.__class__ in (int, float):
        return str(value)
    return coerce(value, target)


def coerce(value: Any, target: type | None) -> Any:
    """Make ``value`` fit ``target`` for a port read or a typed write.

    Strings are converted as literals; ints widen to float; anything else must
    already be an instance. ValueError/TypeError when it does not fit.
    """
    if target is None or value.__class__ is target:
        return value
    if isinstance(value, str):
        return convert_from_string(value, target)
    if target is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, target) and not (target is int and isinstance(value, bool)):
        return value
    raise TypeError(f"{value!r} ({type(value).__name__}) is not a {type_name(target)}")
