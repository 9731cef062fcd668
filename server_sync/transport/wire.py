"""What both WebSocket protocols share (docs/protocol.md): frames, codecs, errors and the
building blocks of their schema checks. Pure functions only: no sockets, no clocks.

A message is a dict whose ``"t"`` names its type. Binary WebSocket frames carry msgpack, text
frames carry JSON; both encode the same dicts, and a server answers in the codec its client
spoke first. A frame or message that breaks a protocol raises :class:`ProtocolError`, whose
``code`` is one of :data:`ERROR_CODES` and whose ``reason`` names the offending field.

The messages themselves are :mod:`server_sync.sync.protocol`'s (the sync server) and
:mod:`server_sync.dialogue.dialogue_protocol`'s (the dialogue server).
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgpack

__all__ = [
    "ERROR_CODES",
    "MAX_ID_LEN",
    "MAX_INTENT_LEN",
    "MAX_REASON_LEN",
    "MAX_TOKEN_LEN",
    "PROTOCOL_VERSION",
    "Codec",
    "ProtocolError",
    "decode",
    "decode_validated",
    "encode",
    "validate_message",
]

PROTOCOL_VERSION = 1

Codec = Literal["msgpack", "json"]

#: every ``error.code`` a server sends (and the close reason it uses)
ERROR_CODES = frozenset({
    "bad_frame",          # not decodable in the frame's codec
    "bad_message",        # decodable, but fails the schema
    "unsupported_version",
    "not_authenticated",  # first message was not hello
    "auth_failed",        # bad signature or malformed token
    "token_expired",
    "rate_limited",
    "too_big",            # inbound frame over the server's limit
    "slow_consumer",      # outbound backlog over the server's limit
    "server_shutdown",
    "replaced",           # the same player connected again elsewhere
    "session_expired",
})

MAX_ID_LEN = 64
MAX_TOKEN_LEN = 1024
MAX_INTENT_LEN = 32
MAX_REASON_LEN = 200


class ProtocolError(Exception):
    """A frame or message that breaks the protocol; ``code`` is in :data:`ERROR_CODES`."""

    def __init__(self, code: str, reason: str) -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown protocol error code {code!r}")
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason


# ---- codecs ------------------------------------------------------------------------------

_packb = msgpack.Packer(use_bin_type=True).pack
_json_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False,
                               allow_nan=False).encode


def encode(message: dict[str, Any], codec: Codec = "msgpack") -> bytes | str:
    """Encode ``message``: msgpack bytes (send as a binary frame) or JSON str (text frame)."""
    if codec == "msgpack":
        return _packb(message)
    if codec == "json":
        return _json_dumps(message)
    raise ValueError(f"unknown codec {codec!r} (expected 'msgpack' or 'json')")


def decode(frame: bytes | str) -> tuple[dict[str, Any], Codec]:
    """Decode one frame into a dict; the codec follows the frame type (bytes: msgpack)."""
    try:
        if isinstance(frame, str):
            obj, codec = json.loads(frame), "json"
        elif isinstance(frame, (bytes, bytearray, memoryview)):
            obj, codec = msgpack.unpackb(frame, raw=False, strict_map_key=True), "msgpack"
        else:
            raise ProtocolError("bad_frame", f"frame must be bytes or str, not {type(frame).__name__}")
    except ProtocolError:
        raise
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError,
            msgpack.StackError) as exc:
        raise ProtocolError("bad_frame", f"undecodable frame: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("bad_message", f"a message must be a map, got {type(obj).__name__}")
    return obj, codec  # type: ignore[return-value]


# ---- schema building blocks --------------------------------------------------------------

def _bad(where: str, what: str) -> ProtocolError:
    return ProtocolError("bad_message", f"{where}: {what}")


def _int(msg: dict[str, Any], key: str, where: str, *, minimum: int = 0,
         optional: bool = False) -> None:
    if key not in msg and optional:
        return
    v = msg.get(key)
    if type(v) is not int:
        raise _bad(where, f"'{key}' must be an integer, got {type(v).__name__}")
    if v < minimum:
        raise _bad(where, f"'{key}' must be >= {minimum}, got {v}")


def _str(msg: dict[str, Any], key: str, where: str, max_len: int, *,
         optional: bool = False) -> None:
    if key not in msg and optional:
        return
    v = msg.get(key)
    if not isinstance(v, str):
        raise _bad(where, f"'{key}' must be a string, got {type(v).__name__}")
    if not 0 < len(v) <= max_len:
        raise _bad(where, f"'{key}' must be 1..{max_len} characters, got {len(v)}")


def _only(msg: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    extra = msg.keys() - allowed
    if extra:
        raise _bad(where, f"unknown field(s) {sorted(map(str, extra))}")


def validate_message(m: dict[str, Any], table: dict[str, Any], direction: str) -> dict[str, Any]:
    """Check ``m`` with the validator ``table`` holds for its type ``t`` (ProtocolError if the
    type is unknown for ``direction`` or a field is bad); return it unchanged."""
    t = m.get("t")
    check = table.get(t) if isinstance(t, str) else None
    if check is None:
        raise _bad("message", f"'t' must be one of {sorted(table)} ({direction}), got {t!r:.40}")
    check(m)
    return m


def decode_validated(frame: bytes | str, table: dict[str, Any], direction: str
                     ) -> tuple[dict[str, Any], Codec]:
    """Decode ``frame`` and check it against ``table`` (see :func:`validate_message`)."""
    m, codec = decode(frame)
    return validate_message(m, table, direction), codec
