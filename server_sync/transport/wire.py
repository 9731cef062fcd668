"""What both WebSocket protocols share (docs/protocol.md): frames, codecs, errors and limits.
Pure functions only: no sockets, no clocks.

A message is a dict whose ``"t"`` names its type. Binary WebSocket frames carry msgpack, text
frames carry JSON; both encode the same dicts, and a server answers in the codec its client
spoke first. A frame or message that breaks a protocol raises :class:`ProtocolError`, whose
``code`` is one of :data:`ERROR_CODES` and whose ``reason`` names the offending field.

The messages themselves are tables of :mod:`server_sync.transport.schema` specs:
:mod:`server_sync.sync.protocol`'s (the sync server) and
:mod:`server_sync.dialogue.dialogue_protocol`'s (the dialogue server).
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgpack

__all__ = [
    "ERROR_CODES",
    "MAX_CLOSE_REASON_BYTES",
    "MAX_ID_LEN",
    "MAX_INTENT_LEN",
    "MAX_REASON_LEN",
    "MAX_TOKEN_LEN",
    "PROTOCOL_VERSION",
    "Codec",
    "ProtocolError",
    "clip_utf8",
    "decode",
    "encode",
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
    "unavailable",        # the server cannot journal (disk full, database error): try later
})

MAX_ID_LEN = 64
MAX_TOKEN_LEN = 1024
MAX_INTENT_LEN = 32
MAX_REASON_LEN = 200
#: a close frame's reason is at most 123 bytes of UTF-8 (RFC 6455: 125 with the 2-byte code)
MAX_CLOSE_REASON_BYTES = 123


def clip_utf8(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` bytes of UTF-8, on a character boundary (a lone
    surrogate, which UTF-8 cannot carry, becomes U+FFFD)."""
    data = text.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return data.decode("utf-8")
    return data[:max_bytes].decode("utf-8", "ignore")


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


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_json_loads = json.JSONDecoder(parse_constant=_no_constant).decode
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
            obj, codec = _json_loads(frame), "json"
        elif isinstance(frame, (bytes, bytearray, memoryview)):
            obj, codec = msgpack.unpackb(frame, raw=False, strict_map_key=True), "msgpack"
        else:
            raise ProtocolError("bad_frame", f"frame must be bytes or str, not {type(frame).__name__}")
    except ProtocolError:
        raise
    except RecursionError:
        raise ProtocolError("bad_frame", "undecodable frame: nested too deeply") from None
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError,
            msgpack.StackError) as exc:
        raise ProtocolError("bad_frame", f"undecodable frame: {str(exc)[:200]}") from None
    if type(obj) is not dict:
        raise ProtocolError("bad_message", f"a message must be a map, got {type(obj).__name__}")
    return obj, codec  # type: ignore[return-value]
