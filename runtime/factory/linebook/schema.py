"""The line book's file format as a table, and the JSON Schema it emits for writers' editors.

:data:`SECTIONS` is the format of one line book file (docs/linebook.md, "Sections"): each
top-level section, what it holds and its shape. :func:`json_schema` turns it into a JSON Schema
(draft 2020-12) that YAML-aware editors (VS Code's YAML extension, IntelliJ) use to complete
section and field names and flag a misspelt field or a string where a list goes while the writer
types::

    flashnpc linebook schema --out linebook.schema.json
    # in a YAML file:  # yaml-language-server: $schema=./linebook.schema.json

The schema checks shapes and names only. What needs the whole book (a group every archetype
must define, a state without replies, a fragment that says another context value's words) is
:func:`runtime.factory.linebook.load_line_book`'s to report, with file, line and field.
"""

from __future__ import annotations

from typing import Any

NAME = {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"}
"""A catalogue name: archetype, trait, state, intent, slot, context value, group."""


def _list(item: dict[str, Any], what: str) -> dict[str, Any]:
    return {"type": "array", "items": item, "description": what}


def _names(what: str) -> dict[str, Any]:
    return _list({"$ref": "#/$defs/name"}, what)


def _map(value: dict[str, Any], what: str) -> dict[str, Any]:
    return {"type": "object", "propertyNames": {"$ref": "#/$defs/name"}, "additionalProperties": value,
            "description": what}


def _object(fields: dict[str, dict[str, Any]], what: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": fields, "additionalProperties": False,
                           "description": what}
    if required:
        out["required"] = list(required)
    return out


def _templates(entry: str) -> dict[str, Any]:
    return {**_list({"$ref": f"#/$defs/{entry}"}, "templates, one drawn per use"), "minItems": 1}


def _tones(entry: str) -> dict[str, dict[str, Any]]:
    return {"calm": _templates(entry), "urgent": _templates(entry)}


DEFS: dict[str, dict[str, Any]] = {
    "name": NAME,
    "template": {"type": "string", "minLength": 1,
                 "description": "a line template: {slot}, [group], (a|b|) alternatives"},
    "fit": {"oneOf": [{"$ref": "#/$defs/template"}, _object({
        "text": {"$ref": "#/$defs/template"},
        "not_with": _names("intents and/or states it is never drawn for"),
        "only_with": _names("intents and/or states it is drawn only for"),
    }, "a template with the writer's marks", ("text",))]},
    "part": {"oneOf": [{"$ref": "#/$defs/template"}, _object({
        "text": {"$ref": "#/$defs/template"},
        "not_with": _names("intents and/or states it is never drawn for"),
        "only_with": _names("intents and/or states it is drawn only for"),
        "at": {"enum": ["start", "end"], "description": "only drawn as the first / last part of a line"},
    }, "a template with the writer's marks and its place in the line", ("text",))]},
    "cell": _map(_map(_templates("part"), "intent -> whole replies"), "state -> intent -> whole replies"),
}

SECTIONS: dict[str, dict[str, Any]] = {
    "slots": _names("free-text slots the game fills after generation: {player}, {location}, {item}"),
    "slot_defaults": _map({"type": "string", "minLength": 1},
                          "what a line says for a slot the game left unfilled"),
    "banned_words": _list({"type": "string", "minLength": 1}, "out-of-setting words and phrases"),
    "archetypes": _map(_object({
        "description": {"type": "string"},
        "slots": _names("slots its voice fragments may use"),
        "voice": _map(_templates("fit"), "voice groups ([address], [oath], ...): drawn once per line"),
        "tags": _object(_tones("part"), "signature lines per tone"),
    }, "an archetype and its voice", ("voice",)), "archetype -> its voice"),
    "persona_traits": _map(_object({
        "description": {"type": "string"},
        "excludes": _names("traits never drawn with this one"),
        **_tones("part"),
    }, "a persona trait and its [mood] fragments per tone"), "trait -> moods"),
    "states": _map(_object({
        "description": {"type": "string"},
        "tone": {"enum": ["calm", "urgent"]},
        "slots": _names("slots its templates may use"),
        "leads": _templates("fit"),
        "codas": _templates("fit"),
    }, "a behaviour state: its tone, leads and codas", ("leads",)), "state -> leads and codas"),
    "intents": _map({"oneOf": [{"type": "null"}, _object({
        "description": {"type": "string"},
        "slots": _names("slots its replies may use"),
    }, "a player's move")]}, "intent -> the slots its replies may use"),
    "context": _map(_map({"oneOf": [{"type": "null"}, _object({
        "description": {"type": "string"},
        "implies": _list({"type": "string", "minLength": 1}, "words that assert this value"),
        **_tones("part"),
    }, "a context value and its fragments")]}, "value -> fragments (null: none)"),
        "context slot -> its values"),
    "replies": _map(_map(_templates("template"), "intent -> replies"), "state -> intent -> replies"),
    "phrases": _map(_templates("template"), "shared phrase groups, [name] in any template"),
    "own_lines": _map(_map(_templates("part"), "state -> the archetype's own lines"),
                      "archetype -> state -> own lines"),
    "own_replies": _map({"$ref": "#/$defs/cell"}, "archetype -> state -> intent -> whole replies"),
    "trait_replies": _map({"$ref": "#/$defs/cell"}, "persona trait -> state -> intent -> whole replies"),
    "compose": _list(_object({
        "pattern": {"type": "string", "minLength": 1, "description": "groups only: [lead] [reply] ..."},
        "weight": {"type": "integer", "minimum": 1, "maximum": 1000},
        "tones": _list({"enum": ["calm", "urgent"]}, "the tones it is drawn for (default both)"),
        "not_with": _names("intents and/or states it is never drawn for"),
        "only_with": _names("intents and/or states it is drawn only for"),
        "max_sentences": {"type": "integer", "minimum": 1, "maximum": 100},
    }, "a compose pattern", ("pattern",)), "how lines are assembled"),
    "expansion": _object({
        "per_condition": {"type": "integer", "minimum": 1, "maximum": 100000},
        "max_words": {"type": "integer", "minimum": 1, "maximum": 200},
        "min_words": {"type": "integer", "minimum": 1, "maximum": 200},
        "seed": {"type": "integer", "minimum": 0, "maximum": 2**31},
    }, "expansion settings"),
    "heldout_pairs": _list({"type": "array", "items": {"$ref": "#/$defs/name"}, "minItems": 2, "maxItems": 2},
                           "[archetype, state] pairs never trained on"),
    "fallbacks": _map({"anyOf": [
        _templates("template"),
        _map(_templates("template"), "any / intent -> lines (per state)"),
        _map({"oneOf": [_templates("template"), _map(_templates("template"), "any / intent -> lines")]},
             "state -> lines (per archetype)"),
    ]}, "state or archetype -> short lines for when the model misses"),
}
"""Every top-level section of a line book file, as a JSON Schema fragment with its description."""


def json_schema() -> dict[str, Any]:
    """The JSON Schema of one line book file (any file of a book directory: sections merge)."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://flashnpc.invalid/linebook.schema.json",
            "title": "FlashNPC line book file",
            "description": "One YAML file of a line book (docs/linebook.md); a book is a directory of them.",
            "type": "object", "properties": SECTIONS, "additionalProperties": False, "$defs": DEFS}


__all__ = ["DEFS", "NAME", "SECTIONS", "json_schema"]
