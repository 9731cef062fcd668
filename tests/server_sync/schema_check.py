"""Every message an in-process server sends during the tests, checked against the shipped JSON
Schemas (server_sync/schemas/*.json) by a small validator of its own (the keywords those files
use), so the published schemas are checked against real traffic, not against the Python tables
they were generated from."""

from __future__ import annotations

import math
from typing import Any

from server_sync.schemas import load_schema
from server_sync.transport.wire import decode

_TYPES = {
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
    "string": lambda v: type(v) is str,
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
    "integer": lambda v: type(v) is int or (type(v) is float and v.is_integer()),
    "number": lambda v: type(v) in (int, float) and math.isfinite(v),
}


def errors(value: Any, schema: dict[str, Any] | bool, root: dict[str, Any], where: str = "$"
           ) -> list[str]:
    """Why ``value`` does not match ``schema`` (empty: it does)."""
    if schema is True:
        return []
    if schema is False:
        return [f"{where}: no value allowed here"]
    out: list[str] = []
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        out += errors(value, root["$defs"][name], root, where)
    if "const" in schema and value != schema["const"]:
        out.append(f"{where}: must be {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{where}: {value!r} not in {schema['enum']}")
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[k](value) for k in kinds):
            return [*out, f"{where}: {type(value).__name__} is not {kinds}"]
    for key in ("oneOf", "anyOf"):
        if key in schema:
            matched = sum(not errors(value, s, root, where) for s in schema[key])
            if (key == "oneOf" and matched != 1) or matched == 0:
                out.append(f"{where}: {matched} of the {key} alternatives match")
    if type(value) is str and not schema.get("minLength", 0) <= len(value) \
            <= schema.get("maxLength", math.inf):
        out.append(f"{where}: length {len(value)} outside the schema's bounds")
    if type(value) in (int, float) and not schema.get("minimum", -math.inf) <= value \
            <= schema.get("maximum", math.inf):
        out.append(f"{where}: {value} outside {schema.get('minimum')}..{schema.get('maximum')}")
    if type(value) is list:
        out += _array(value, schema, root, where)
    if type(value) is dict:
        out += _object(value, schema, root, where)
    return out


def _array(value: list[Any], schema: dict[str, Any], root: dict[str, Any], where: str
           ) -> list[str]:
    out = []
    if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", math.inf):
        out.append(f"{where}: {len(value)} items outside the schema's bounds")
    prefix = schema.get("prefixItems", [])
    for i, item in enumerate(value):
        sub = prefix[i] if i < len(prefix) else schema.get("items", True)
        out += errors(item, sub, root, f"{where}[{i}]")
    return out


def _object(value: dict[str, Any], schema: dict[str, Any], root: dict[str, Any], where: str
            ) -> list[str]:
    out = [f"{where}: '{k}' is required" for k in schema.get("required", []) if k not in value]
    if len(value) > schema.get("maxProperties", math.inf):
        out.append(f"{where}: {len(value)} properties, more than allowed")
    props = schema.get("properties", {})
    for k, v in value.items():
        if "propertyNames" in schema:
            out += errors(k, schema["propertyNames"], root, f"{where} key {k!r}")
        if k in props:
            out += errors(v, props[k], root, f"{where}.{k}")
        else:
            out += errors(v, schema.get("additionalProperties", True), root, f"{where}.{k}")
    return out


class OutboundRecorder:
    """The hook the test suite installs as ``server_sync.transport.gate.outbound_check``."""

    def __init__(self) -> None:
        self.schemas = {name: load_schema(name, "server") for name in ("sync", "dialogue")}
        self.checked: dict[str, int] = {}
        self.violations: list[str] = []

    def __call__(self, schema_name: str, frame: bytes | str) -> None:
        schema = self.schemas[schema_name]
        message, _ = decode(frame)
        problems = errors(message, schema, schema)
        key = f"{schema_name}.{message.get('t')}"
        self.checked[key] = self.checked.get(key, 0) + 1
        if problems:
            self.violations.append(f"{key}: {problems[:3]} in {str(message)[:300]}")
