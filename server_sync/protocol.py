"""Wire format of the FlashNPC sync protocol (version 1), see docs/protocol.md.

Pure functions only: no sockets, no clocks. A message is a dict whose ``"t"`` names its
type. Binary WebSocket frames carry msgpack, text frames carry JSON; both encode the
same dicts, and a server answers in the codec its client spoke first.

Client -> server: ``hello``, ``intent``, ``resync``, ``bye``.
Server -> client: ``snapshot``, ``delta``, ``ack``, ``error``, ``bye``.

:func:`decode_client` / :func:`decode_server` decode *and* validate: anything that is not
a well-formed message of the expected direction raises :class:`ProtocolError` whose
``code`` is one of :data:`ERROR_CODES` and whose ``reason`` names the offending field.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

import msgpack

__all__ = [
    "ERROR_CODES",
    "PROTOCOL_VERSION",
    "Codec",
    "ProtocolError",
    "decode",
    "decode_client",
    "decode_server",
    "encode",
    "validate_client",
    "validate_server",
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


# ---- schema ------------------------------------------------------------------------------

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


def _pos(v: Any, where: str) -> None:
    if not (isinstance(v, (list, tuple)) and len(v) == 2
            and all(type(c) in (int, float) and math.isfinite(c) for c in v)):
        raise _bad(where, f"a position must be [x, y] with finite numbers, got {v!r:.60}")


def _only(msg: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    extra = msg.keys() - allowed
    if extra:
        raise _bad(where, f"unknown field(s) {sorted(map(str, extra))}")


_SCALARS = (str, int, float, bool, type(None))


def _state(v: Any, where: str) -> None:
    if not isinstance(v, dict):
        raise _bad(where, f"state must be a map, got {type(v).__name__}")
    for k, x in v.items():
        if not isinstance(k, str) or not isinstance(x, _SCALARS):
            raise _bad(where, f"state entry {k!r} must map a string to a scalar")


def _validate_hello(m: dict[str, Any]) -> None:
    _only(m, frozenset({"t", "v", "token", "resume", "pos"}), "hello")
    _int(m, "v", "hello", minimum=1)
    _str(m, "token", "hello", MAX_TOKEN_LEN)
    if "pos" in m:
        _pos(m["pos"], "hello.pos")
    if "resume" in m:
        r = m["resume"]
        if not isinstance(r, dict):
            raise _bad("hello.resume", "must be a map {epoch, seq}")
        _only(r, frozenset({"epoch", "seq"}), "hello.resume")
        _str(r, "epoch", "hello.resume", MAX_ID_LEN)
        _int(r, "seq", "hello.resume")


def _validate_intent(m: dict[str, Any]) -> None:
    _only(m, frozenset({"t", "cseq", "pos", "talk"}), "intent")
    _int(m, "cseq", "intent", minimum=1)
    if "pos" not in m and "talk" not in m:
        raise _bad("intent", "needs 'pos' or 'talk'")
    if "pos" in m:
        _pos(m["pos"], "intent.pos")
    if "talk" in m:
        talk = m["talk"]
        if not isinstance(talk, dict):
            raise _bad("intent.talk", "must be a map {npc, intent}")
        _only(talk, frozenset({"npc", "intent"}), "intent.talk")
        _str(talk, "npc", "intent.talk", MAX_ID_LEN)
        _str(talk, "intent", "intent.talk", MAX_INTENT_LEN)


def _validate_resync(m: dict[str, Any]) -> None:
    _only(m, frozenset({"t", "seq"}), "resync")
    _int(m, "seq", "resync")


def _validate_bye(m: dict[str, Any]) -> None:
    _only(m, frozenset({"t", "reason"}), "bye")
    _str(m, "reason", "bye", MAX_REASON_LEN, optional=True)


def _validate_npcs(v: Any, where: str) -> None:
    if not isinstance(v, dict):
        raise _bad(where, "must be a map of npc id -> {pos, state}")
    for nid, e in v.items():
        if not isinstance(nid, str) or not isinstance(e, dict) or e.keys() != {"pos", "state"}:
            raise _bad(where, f"entry {nid!r} must be {{pos, state}}")
        _pos(e["pos"], f"{where}[{nid}].pos")
        _state(e["state"], f"{where}[{nid}].state")


def _validate_snapshot(m: dict[str, Any]) -> None:
    _only(m, frozenset({"t", "v", "epoch", "seq", "time", "radius", "npcs"}), "snapshot")
    _int(m, "v", "snapshot", minimum=1)
    _str(m, "epoch", "snapshot", MAX_ID_LEN)
    _int(m, "seq", "snapshot")
    if type(m.get("time")) not in (int, float) or type(m.get("radius")) not in (int, float):
        raise _bad("snapshot", "'time' and 'radius' must be numbers")
    _validate_npcs(m.get("npcs"), "snapshot.npcs")


def _validate_delta(m: dict[str, Any]) -> None:
    _only(m, frozenset({"t", "seq", "time", "enter", "leave", "set", "move", "ack"}), "delta")
    _int(m, "seq", "delta", minimum=1)
    _int(m, "ack", "delta", optional=True)
    if type(m.get("time")) not in (int, float):
        raise _bad("delta", "'time' must be a number")
    if "enter" in m:
        _validate_npcs(m["enter"], "delta.enter")
    if "leave" in m and not (isinstance(m["leave"], list)
                             and all(isinstance(x, str) for x in m["leave"])):
        raise _bad("delta.leave", "must be a list of npc ids")
    if "set" in m:
        s = m["set"]
        if not isinstance(s, dict):
            raise _bad("delta.set", "must be a map of npc id -> state changes")
        for nid, ch in s.items():
            _state(ch, f"delta.set[{nid}]")
    if "move" in m:
        mv = m["move"]
        if not isinstance(mv, dict):
            raise _bad("delta.move", "must be a map of npc id -> [x, y]")
        for nid, p in mv.items():
            _pos(p, f"delta.move[{nid}]")


def _validate_ack(m: dict[str, Any]) -> None:
    _only(m, frozenset({"t", "cseq"}), "ack")
    _int(m, "cseq", "ack")  # 0: no intent applied yet (the answer to a hello)


def _validate_error(m: dict[str, Any]) -> None:
    _only(m, frozenset({"t", "code", "reason"}), "error")
    _str(m, "code", "error", MAX_ID_LEN)
    _str(m, "reason", "error", MAX_REASON_LEN * 4)


_CLIENT = {"hello": _validate_hello, "intent": _validate_intent,
           "resync": _validate_resync, "bye": _validate_bye}
_SERVER = {"snapshot": _validate_snapshot, "delta": _validate_delta, "ack": _validate_ack,
           "error": _validate_error, "bye": _validate_bye}


def validate_message(m: dict[str, Any], table: dict[str, Any], direction: str) -> dict[str, Any]:
    """Check ``m`` with the validator ``table`` holds for its type ``t`` (ProtocolError if the
    type is unknown for ``direction`` or a field is bad); return it unchanged."""
    t = m.get("t")
    check = table.get(t) if isinstance(t, str) else None
    if check is None:
        raise _bad("message", f"'t' must be one of {sorted(table)} ({direction}), got {t!r:.40}")
    check(m)
    return m


def validate_client(message: dict[str, Any]) -> dict[str, Any]:
    """Check a client -> server message against the schema; return it unchanged."""
    return validate_message(message, _CLIENT, "client to server")


def validate_server(message: dict[str, Any]) -> dict[str, Any]:
    """Check a server -> client message against the schema; return it unchanged."""
    return validate_message(message, _SERVER, "server to client")


def decode_validated(frame: bytes | str, table: dict[str, Any], direction: str
                     ) -> tuple[dict[str, Any], Codec]:
    """Decode ``frame`` and check it against ``table`` (see :func:`validate_message`)."""
    m, codec = decode(frame)
    return validate_message(m, table, direction), codec


def decode_client(frame: bytes | str) -> tuple[dict[str, Any], Codec]:
    """Decode and validate a frame a server received."""
    return decode_validated(frame, _CLIENT, "client to server")


def decode_server(frame: bytes | str) -> tuple[dict[str, Any], Codec]:
    """Decode and validate a frame a client received."""
    return decode_validated(frame, _SERVER, "server to client")
