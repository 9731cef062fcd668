"""Hypothesis strategies built from the protocol tables (server_sync.transport.schema): valid
messages of every type, messages with one field broken, and frames that are not messages at all."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgpack
from hypothesis import assume
from hypothesis import strategies as st

from server_sync.transport.schema import (
    Bool,
    Int,
    ListOf,
    MapOf,
    Message,
    Nullable,
    Num,
    Obj,
    Pos,
    Protocol,
    Scalar,
    Spec,
    Str,
)

# text a server must carry through both codecs: no lone surrogates (refused separately)
_CHARS = st.characters(blacklist_categories=("Cs",))


def valid(spec: Spec) -> st.SearchStrategy[Any]:
    """Values ``spec`` accepts (small ones: maps and lists of a few entries)."""
    if isinstance(spec, Int):
        edges = st.sampled_from([spec.minimum, spec.maximum])
        return st.one_of(edges, st.integers(spec.minimum, min(spec.maximum, spec.minimum + 10**6)))
    if isinstance(spec, Num):
        return st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-10**9, 10**9))
    if isinstance(spec, Str):
        if spec.enum:
            return st.sampled_from(spec.enum)
        return st.text(_CHARS, min_size=spec.min_len, max_size=min(spec.max_len, 40))
    if isinstance(spec, Bool):
        return st.booleans()
    if isinstance(spec, Scalar):
        return st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                         st.floats(allow_nan=False, allow_infinity=False),
                         st.text(_CHARS, max_size=20))
    if isinstance(spec, Pos):
        coord = st.floats(-1e6, 1e6, allow_nan=False)
        return st.lists(coord, min_size=2, max_size=2)
    if isinstance(spec, Nullable):
        return st.one_of(st.none(), valid(spec.inner))
    if isinstance(spec, ListOf):
        return st.lists(valid(spec.item), max_size=min(spec.max_items, 3))
    if isinstance(spec, MapOf):
        return st.dictionaries(valid(spec.key), valid(spec.value), max_size=min(spec.max_items, 3))
    if isinstance(spec, Obj):
        required = {k: valid(f.spec) for k, f in spec.fields.items() if f.required}
        optional = {k: valid(f.spec) for k, f in spec.fields.items() if not f.required}
        objs = st.fixed_dictionaries(required, optional=optional)
        if spec.any_of:
            objs = objs.filter(lambda d: any(k in d for k in spec.any_of))
        return objs
    value = getattr(spec, "value", None)  # the message type's constant
    return st.just(value)


def valid_message(protocol: Protocol, direction: str) -> st.SearchStrategy[dict[str, Any]]:
    table: dict[str, Message] = protocol.tables[direction]
    return st.one_of(*(valid(m.obj) for m in table.values()))


# values that break most fields: wrong types, numbers the journal or a double cannot hold,
# deep nesting, text too long, lone surrogates
_WRONG = st.one_of(
    st.none(), st.booleans(), st.just(-1), st.just(0), st.just(2**53), st.just(2**63),
    st.just(2**64 - 1), st.just(-(2**63)), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3), st.just("x" * 5000), st.just("\ud800"), st.just([]), st.just({}),
    st.just([1, 2, 3]), st.just({"a": {"b": {"c": [1]}}}), st.binary(max_size=8),
    st.integers(min_value=0, max_value=400).map(lambda d: _nest(d)),
)


def _nest(depth: int) -> Any:
    v: Any = 0
    for _ in range(depth):
        v = [v]
    return v


@st.composite
def mutated_message(draw: Any, protocol: Protocol, direction: str) -> dict[str, Any]:
    """A valid message with one change: a field dropped, replaced by a wrong value, an unknown
    field added, or the type name broken."""
    msg = dict(draw(valid_message(protocol, direction)))
    keys = [k for k in msg if k != "t"]
    how = draw(st.sampled_from(["drop", "replace", "add", "type"] if keys else ["add", "type"]))
    if how == "drop":
        del msg[draw(st.sampled_from(keys))]
    elif how == "replace":
        msg[draw(st.sampled_from(keys))] = draw(_WRONG)
    elif how == "add":
        msg[draw(st.text(_CHARS, min_size=1, max_size=10).filter(lambda k: k not in msg))] = 1
    else:
        msg["t"] = draw(st.one_of(st.text(max_size=12), _WRONG))
    return msg


def encodable(msg: Any, codec: str) -> bytes | str | None:
    """``msg`` encoded, or None when the codec cannot hold it (a lone surrogate in msgpack,
    an integer past 64 bits)."""
    try:
        if codec == "msgpack":
            return msgpack.packb(msg, use_bin_type=True)
        return json.dumps(msg, allow_nan=True)
    except (ValueError, TypeError, OverflowError, UnicodeEncodeError, RecursionError):
        return None


#: frames that are not messages: random bytes, broken JSON, valid encodings of non-maps
garbage_frame = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=64),
    st.sampled_from(["{", "[]", "null", "1e999", '{"t": NaN}', '{"t": Infinity}', "\"t\"",
                     '{"t":"hello","v":1,"token":"a.b.c"} trailing', '{"t": "hello"}{}']),
    st.integers(0, 2000).map(lambda d: '{"t":' + "[" * d + "]" * d + "}"),
    st.integers(0, 3000).map(lambda d: b"\x81\xa1t" + b"\x91" * d + b"\x00"),
    st.binary(max_size=8).map(lambda b: b"\xc1" + b),  # msgpack's reserved byte
)


@st.composite
def hostile_case(draw: Any, protocol: Protocol, hello: Callable[[str], bytes | str]
                 ) -> tuple[list[bytes | str], bool, str]:
    """One hostile connection: (frames, send bytes as text frames, kind). The last frame is
    what the server must refuse: garbage, a message its validators refuse (first or after a
    valid ``hello(codec)``), invalid UTF-8 in a text frame, or a frame over 4096 bytes."""
    kind = draw(st.sampled_from(["garbage", "message", "utf8", "oversize"]))
    after_hello = draw(st.booleans())
    text = False
    if kind == "garbage":
        frame: bytes | str = draw(garbage_frame)
    elif kind == "message":
        msg = draw(mutated_message(protocol, "client"))
        try:
            protocol.validate(msg, "client")
            valid_anyway = True
        except Exception:
            valid_anyway = False
        assume(not valid_anyway)
        codec = draw(st.sampled_from(["msgpack", "json"]))
        encoded = encodable(msg, codec) or encodable(msg, "json" if codec == "msgpack" else "msgpack")
        assume(encoded is not None)
        frame = encoded  # type: ignore[assignment]
    elif kind == "utf8":
        frame = draw(st.binary(min_size=1, max_size=32).filter(_not_utf8))
        text = True
    else:
        frame = draw(st.sampled_from([b"\x80" * 5000, "x" * 4097, b"\x00" * 70_000]))
    codec_of_hello = "json" if isinstance(frame, str) or text else "msgpack"
    frames = [hello(codec_of_hello), frame] if after_hello else [frame]
    return frames, text, f"{kind}{'+hello' if after_hello else ''}"


def _not_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False
