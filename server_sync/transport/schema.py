"""Declarative message schemas: one table per protocol drives the validators and the JSON Schemas.

A protocol (:class:`Protocol`) is a table of :class:`Message` specs per direction; a message
is an object of fields, each a :class:`Spec` (:class:`Int`, :class:`Num`, :class:`Str`,
:class:`Bool`, :class:`Scalar`, :class:`Pos`, :class:`ListOf`, :class:`MapOf`, :class:`Obj`,
:class:`Nullable`). The same objects check a decoded message (:meth:`Protocol.validate`,
raising :class:`~server_sync.transport.wire.ProtocolError` ``bad_message`` with a reason
that names the offending field) and render themselves as JSON Schema (draft 2020-12,
:meth:`Protocol.json_schema`), so the published schemas cannot drift from what the servers
accept and send.

Limits every protocol shares: integers are exact in an IEEE double and fit a signed 64-bit
SQLite column (``0..2**53-1`` unless narrower); numbers are finite; strings are valid
Unicode (no lone surrogates, which neither UTF-8 nor msgpack can carry) with a maximum
length in characters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .wire import Codec, ProtocolError, decode

__all__ = ["MAX_INT", "Bool", "Int", "ListOf", "MapOf", "Message", "Nullable", "Num", "Obj",
           "Pos", "Protocol", "Scalar", "Spec", "Str", "describe"]

#: the largest integer any message may carry: exact in a double (JSON, GDScript, JavaScript)
#: and storable in the server's SQLite journal (a signed 64-bit column)
MAX_INT = 2**53 - 1


def describe(v: Any) -> str:
    """A short, safe description of a received value for an error reason: short scalars are
    shown, anything else is named by its type (never repr'd whole: it may be deep or huge)."""
    if v is None or isinstance(v, bool):
        return repr(v)
    if isinstance(v, int):
        return repr(v) if abs(v) < 10**24 else f"an integer of {len(str(abs(v)))} digits"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return repr(v[:40]) + ("..." if len(v) > 40 else "")
    return f"a {type(v).__name__}"


def _bad(where: str, what: str) -> ProtocolError:
    return ProtocolError("bad_message", f"{where}: {what}")


def _valid_unicode(s: str) -> bool:
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Spec:
    """One value's rule. Leaf specs answer :meth:`problem` (None: fine); containers
    override :meth:`check`, which raises naming ``where``. A spec with a fixed JSON Schema
    sets ``json_type`` and ``words`` (for 'is required (...)' reasons)."""

    json_type: ClassVar[dict[str, Any]] = {}
    words: ClassVar[str] = "a value"
    leaf: ClassVar[bool] = True  # answers problem() cheaply (containers raise from check())
    description: str = ""

    def problem(self, v: Any) -> str | None:
        raise NotImplementedError

    def check(self, v: Any, where: str) -> None:
        p = self.problem(v)
        if p is not None:
            raise _bad(where, p)

    def field_check(self, v: Any, where: str, key: str) -> None:
        """Check ``v``, the value of field ``key`` of the object at ``where``."""
        p = self.problem(v)
        if p is not None:
            raise _bad(where, f"'{key}' {p}")

    def json(self) -> dict[str, Any]:
        return _doc(dict(self.json_type), self.description)

    def summary(self) -> str:
        """A few words for 'is required (...)' reasons."""
        return self.words


@dataclass(frozen=True)
class Int(Spec):
    """An integer in ``minimum..maximum`` (booleans are not integers)."""

    minimum: int = 0
    maximum: int = MAX_INT
    description: str = ""

    def problem(self, v: Any) -> str | None:
        if type(v) is not int:
            return f"must be an integer, got {describe(v) if v is None else type(v).__name__}"
        if v < self.minimum:
            return f"must be >= {self.minimum}, got {describe(v)}"
        if v > self.maximum:
            return f"must be <= {self.maximum}, got {describe(v)}"
        return None

    def json(self) -> dict[str, Any]:
        return _doc({"type": "integer", "minimum": self.minimum, "maximum": self.maximum},
                    self.description)

    def summary(self) -> str:
        return f"an integer {self.minimum}..{self.maximum}"


@dataclass(frozen=True)
class Num(Spec):
    """A finite number (integer or double)."""

    json_type: ClassVar[dict[str, Any]] = {"type": "number"}
    words: ClassVar[str] = "a number"
    description: str = ""

    def problem(self, v: Any) -> str | None:
        t = type(v)
        if t is float:
            return None if math.isfinite(v) else f"must be a finite number, got {v!r}"
        if t is int:
            return None if -MAX_INT <= v <= MAX_INT else f"must be a number, got {describe(v)}"
        return f"must be a number, got {type(v).__name__}"


_NUM = Num()


@dataclass(frozen=True)
class Str(Spec):
    """A string of ``min_len..max_len`` characters (code points), valid Unicode; with ``enum``
    one of those values."""

    max_len: int
    min_len: int = 1
    description: str = ""
    enum: tuple[str, ...] = ()

    def problem(self, v: Any) -> str | None:
        if type(v) is not str:
            return f"must be a string, got {type(v).__name__}"
        if not self.min_len <= len(v) <= self.max_len:
            return f"must be {self.min_len}..{self.max_len} characters, got {len(v)}"
        if not _valid_unicode(v):
            return "must be valid Unicode (it holds a lone surrogate)"
        if self.enum and v not in self.enum:
            return f"must be one of {', '.join(self.enum)}, got {describe(v)}"
        return None

    def json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "string", "minLength": self.min_len,
                               "maxLength": self.max_len}
        if self.enum:
            out["enum"] = list(self.enum)
        return _doc(out, self.description)

    def summary(self) -> str:
        return f"a string of {self.min_len}..{self.max_len} characters"


@dataclass(frozen=True)
class Bool(Spec):
    json_type: ClassVar[dict[str, Any]] = {"type": "boolean"}
    words: ClassVar[str] = "true or false"
    description: str = ""

    def problem(self, v: Any) -> str | None:
        return None if type(v) is bool else f"must be true or false, got {type(v).__name__}"


@dataclass(frozen=True)
class Scalar(Spec):
    """A synced state value: a string (at most ``max_len``), a finite number, a bool or null."""

    max_len: int = 1024
    description: str = ""

    def problem(self, v: Any) -> str | None:
        if v is None or type(v) is bool:
            return None
        if type(v) is str:
            if len(v) > self.max_len:
                return f"must be at most {self.max_len} characters, got {len(v)}"
            return None if _valid_unicode(v) else "must be valid Unicode (it holds a lone surrogate)"
        if type(v) in (int, float):
            return _NUM.problem(v)
        return f"must be a string, number, boolean or null, got {type(v).__name__}"

    def json(self) -> dict[str, Any]:
        return _doc({"type": ["string", "number", "boolean", "null"],
                     "maxLength": self.max_len}, self.description)


@dataclass(frozen=True)
class Pos(Spec):
    """A position ``[x, y]``: two finite numbers."""

    description: str = "[x, y] in world units"

    def problem(self, v: Any) -> str | None:
        if (type(v) is list or type(v) is tuple) and len(v) == 2 \
                and _NUM.problem(v[0]) is None and _NUM.problem(v[1]) is None:
            return None
        return f"must be [x, y] with finite numbers, got {describe(v)}"

    def json(self) -> dict[str, Any]:
        return _doc({"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}],
                     "items": False, "minItems": 2, "maxItems": 2}, self.description)


@dataclass(frozen=True)
class Nullable(Spec):
    """``inner`` or null."""

    inner: Spec
    description: str = ""

    def problem(self, v: Any) -> str | None:
        return None if v is None else self.inner.problem(v)

    def json(self) -> dict[str, Any]:
        return _doc({"anyOf": [self.inner.json(), {"type": "null"}]}, self.description)


class _Container(Spec):
    leaf: ClassVar[bool] = False

    def field_check(self, v: Any, where: str, key: str) -> None:
        self.check(v, f"{where}.{key}")

    def problem(self, v: Any) -> str | None:
        try:
            self.check(v, "value")
        except ProtocolError as err:
            return err.reason
        return None


@dataclass(frozen=True)
class ListOf(_Container):
    """A list of at most ``max_items`` values of ``item``."""

    item: Spec
    max_items: int
    description: str = ""

    def check(self, v: Any, where: str) -> None:
        if type(v) is not list:
            raise _bad(where, f"must be a list, got {type(v).__name__}")
        if len(v) > self.max_items:
            raise _bad(where, f"must hold at most {self.max_items} items, got {len(v)}")
        item = self.item
        for i, x in enumerate(v):
            if item.leaf:
                p = item.problem(x)
                if p is not None:
                    raise _bad(f"{where}[{i}]", p)
            else:
                item.check(x, f"{where}[{i}]")

    def json(self) -> dict[str, Any]:
        return _doc({"type": "array", "items": self.item.json(), "maxItems": self.max_items},
                    self.description)


@dataclass(frozen=True)
class MapOf(_Container):
    """A map of at most ``max_items`` entries, keys checked by ``key``, values by ``value``."""

    value: Spec
    key: Str = Str(64)
    max_items: int = 100_000
    description: str = ""

    def check(self, v: Any, where: str) -> None:
        if type(v) is not dict:
            raise _bad(where, f"must be a map, got {type(v).__name__}")
        if len(v) > self.max_items:
            raise _bad(where, f"must hold at most {self.max_items} entries, got {len(v)}")
        key, value, leaf = self.key, self.value, self.value.leaf
        for k, x in v.items():
            p = key.problem(k)
            if p is not None:
                raise _bad(where, f"key {describe(k)} {p}")
            if leaf:  # no path string unless something is wrong
                p = value.problem(x)
                if p is not None:
                    raise _bad(f"{where}[{k}]", p)
            else:
                value.check(x, f"{where}[{k}]")

    def json(self) -> dict[str, Any]:
        return _doc({"type": "object", "propertyNames": self.key.json(),
                     "additionalProperties": self.value.json(),
                     "maxProperties": self.max_items}, self.description)


@dataclass(frozen=True)
class F:
    """A field of an :class:`Obj`: its spec, whether it is required, what it means."""

    spec: Spec
    required: bool = True
    doc: str = ""


@dataclass(frozen=True)
class Obj(_Container):
    """An object with exactly the fields ``fields`` (unknown fields are an error);
    ``any_of``: groups of fields of which at least one must be present."""

    fields: Mapping[str, F]
    any_of: tuple[str, ...] = ()
    description: str = ""

    def __post_init__(self) -> None:
        required = tuple(k for k, f in self.fields.items() if f.required)
        object.__setattr__(self, "_required", required)

    def check(self, v: Any, where: str) -> None:
        if type(v) is not dict:
            raise _bad(where, f"must be a map, got {type(v).__name__}")
        fields = self.fields
        if not fields.keys() >= v.keys():
            extra = sorted(describe(x) for x in v if x not in fields)
            raise _bad(where, f"unknown field(s) {', '.join(extra[:5])}")
        for name in self._required:  # type: ignore[attr-defined]
            if name not in v:
                raise _bad(where, f"'{name}' is required ({fields[name].spec.summary()})")
        for name, x in v.items():
            spec = fields[name].spec
            if spec.leaf:
                p = spec.problem(x)
                if p is not None:
                    raise _bad(where, f"'{name}' {p}")
            else:
                spec.check(x, f"{where}.{name}")
        if self.any_of and not any(k in v for k in self.any_of):
            names = [f"'{k}'" for k in self.any_of]
            raise _bad(where, f"needs {', '.join(names[:-1])} or {names[-1]}")

    def json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "object",
            "properties": {k: _doc(f.spec.json(), f.doc) for k, f in self.fields.items()},
            "required": [k for k, f in self.fields.items() if f.required],
            "additionalProperties": False,
        }
        if self.any_of:
            out["anyOf"] = [{"required": [k]} for k in self.any_of]
        return _doc(out, self.description)


def _doc(schema: dict[str, Any], description: str) -> dict[str, Any]:
    if description:
        schema = {**schema, "description": description}
    return schema


@dataclass(frozen=True)
class Message:
    """A message type ``t`` with its fields (``t`` itself is implied); ``doc``: what it means."""

    t: str
    fields: Mapping[str, F]
    doc: str = ""
    any_of: tuple[str, ...] = ()
    obj: Obj = field(init=False)

    def __post_init__(self) -> None:
        body = {"t": F(_Const(self.t), doc=f"message type, always {self.t!r}"), **self.fields}
        object.__setattr__(self, "obj", Obj(body, self.any_of, self.doc))


@dataclass(frozen=True)
class _Const(Spec):
    value: str

    def problem(self, v: Any) -> str | None:
        return None if v == self.value else f"must be {self.value!r}"

    def json(self) -> dict[str, Any]:
        return {"const": self.value}


class Protocol:
    """The messages of one protocol, per direction; validators and JSON Schemas from them."""

    def __init__(self, name: str, title: str, version: int, client: list[Message],
                 server: list[Message]) -> None:
        self.name = name
        self.title = title
        self.version = version
        self.tables: dict[str, dict[str, Message]] = {
            "client": {m.t: m for m in client}, "server": {m.t: m for m in server}}

    def validate(self, m: dict[str, Any], direction: str) -> dict[str, Any]:
        """Check the decoded message ``m`` sent in ``direction`` ('client': client to server,
        'server': server to client); return it unchanged, or raise ProtocolError."""
        table = self.tables[direction]
        t = m.get("t")
        spec = table.get(t) if type(t) is str else None
        if spec is None:
            raise _bad("message", f"'t' must be one of {sorted(table)} ({self.name} {direction} "
                                  f"message), got {describe(t)}")
        spec.obj.check(m, t)
        return m

    def decoder(self, direction: str) -> Callable[[bytes | str], tuple[dict[str, Any], Codec]]:
        """A function that decodes a frame and validates it as a ``direction`` message."""
        validate = self.validate

        def decode_validated(frame: bytes | str) -> tuple[dict[str, Any], Codec]:
            m, codec = decode(frame)
            return validate(m, direction), codec

        return decode_validated

    def json_schema(self, direction: str) -> dict[str, Any]:
        """JSON Schema (draft 2020-12) of every ``direction`` message: one ``$defs`` entry per
        type and a ``oneOf`` over them."""
        table = self.tables[direction]
        who = "client to server" if direction == "client" else "server to client"
        return {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"urn:flashnpc:schema:{self.name}_{direction}:v{self.version}",
            "title": f"{self.title}, version {self.version}: {who} messages",
            "description": "Generated from the table the server's validators use "
                           "(server_sync.schemas); do not edit. Integers are 0..2^53-1 unless "
                           "narrower, numbers finite, strings valid Unicode.",
            "oneOf": [{"$ref": f"#/$defs/{t}"} for t in table],
            "$defs": {t: m.obj.json() for t, m in table.items()},
        }
