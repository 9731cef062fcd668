"""Wire format of FlashNPC dialogue over WebSockets (version 1), see docs/protocol.md.

Pure functions only, like :mod:`server_sync.sync.protocol`, on the same wire format
(:mod:`server_sync.transport.wire`: msgpack in binary frames, JSON in text frames, and
:class:`~server_sync.transport.wire.ProtocolError`).

Client -> server: ``hello``, ``open_session``, ``request_line``, ``update_state``,
``close_session``, ``bye``. Every message but ``hello`` and ``bye`` carries ``rid``, the
client's request id (an integer >= 1), which the server's answer repeats.

Server -> client: ``welcome`` (answers ``hello``), ``session`` (answers ``open_session``),
``piece`` (streamed text of a ``request_line``), ``line`` (the finished line), ``ok``
(answers ``update_state`` / ``close_session``), ``busy`` (with ``retry_after_ms``),
``error`` (with ``rid`` when it concerns one request; without, the connection closes),
``bye``.
"""

from __future__ import annotations

from typing import Any

from ..transport.wire import (
    MAX_ID_LEN,
    MAX_INTENT_LEN,
    MAX_REASON_LEN,
    MAX_TOKEN_LEN,
    PROTOCOL_VERSION,
    Codec,
    _bad,
    _int,
    _only,
    _str,
    decode_validated,
    validate_message,
)

__all__ = [
    "DIALOGUE_PROTOCOL_VERSION",
    "MAX_CONTEXT_ENTRIES",
    "MAX_PERSONA",
    "REQUEST_ERROR_CODES",
    "decode_dialogue_client",
    "decode_dialogue_server",
    "validate_dialogue_client",
    "validate_dialogue_server",
]

DIALOGUE_PROTOCOL_VERSION = PROTOCOL_VERSION
MAX_PERSONA = 8
MAX_CONTEXT_ENTRIES = 16
MAX_VALUE_LEN = 64
MAX_TEXT_LEN = 2000
MAX_DEADLINE_MS = 60_000
MAX_TOKENS = 256

#: ``error.code`` values that concern one request (they carry its ``rid``; the connection stays)
REQUEST_ERROR_CODES = frozenset({
    "unknown_session",   # no session with this id is open on this connection
    "invalid_request",   # a value the model's catalog does not know (reason lists the known ones)
    "too_many_sessions",
    "duplicate_rid",     # a request with this rid is still in flight
})


def _bool(m: dict[str, Any], key: str, where: str) -> None:
    if key in m and type(m[key]) is not bool:
        raise _bad(where, f"'{key}' must be true or false, got {type(m[key]).__name__}")


def _bounded_int(m: dict[str, Any], key: str, where: str, lo: int, hi: int) -> None:
    if key in m:
        _int(m, key, where, minimum=lo)
        if m[key] > hi:
            raise _bad(where, f"'{key}' must be <= {hi}, got {m[key]}")


def _persona(m: dict[str, Any], where: str) -> None:
    if "persona" not in m:
        return
    p = m["persona"]
    if not (isinstance(p, list) and len(p) <= MAX_PERSONA
            and all(isinstance(x, str) and 0 < len(x) <= MAX_ID_LEN for x in p)):
        raise _bad(where, f"'persona' must be a list of at most {MAX_PERSONA} trait names")


def _context(m: dict[str, Any], where: str) -> None:
    if "context" not in m:
        return
    c = m["context"]
    if not isinstance(c, dict) or len(c) > MAX_CONTEXT_ENTRIES:
        raise _bad(where, f"'context' must be a map of at most {MAX_CONTEXT_ENTRIES} entries")
    for k, v in c.items():
        if not (isinstance(k, str) and 0 < len(k) <= MAX_ID_LEN
                and isinstance(v, str) and 0 < len(v) <= MAX_VALUE_LEN):
            raise _bad(where, f"context entry {str(k)[:40]!r} must map a name to a string "
                              f"of 1..{MAX_VALUE_LEN} characters")


def _validate_hello(m: dict[str, Any]) -> None:
    _only(m, frozenset({"t", "v", "token"}), "hello")
    _int(m, "v", "hello", minimum=1)
    _str(m, "token", "hello", MAX_TOKEN_LEN)


def _validate_open(m: dict[str, Any]) -> None:
    w = "open_session"
    _only(m, frozenset({"t", "rid", "archetype", "persona", "state", "context"}), w)
    _int(m, "rid", w, minimum=1)
    _str(m, "archetype", w, MAX_ID_LEN)
    _str(m, "state", w, MAX_ID_LEN)
    _persona(m, w)
    _context(m, w)


def _validate_request(m: dict[str, Any]) -> None:
    w = "request_line"
    _only(m, frozenset({"t", "rid", "session", "intent", "context", "stream", "deadline_ms",
                        "critical", "batch", "seed", "max_tokens"}), w)
    _int(m, "rid", w, minimum=1)
    _str(m, "session", w, MAX_ID_LEN)
    _str(m, "intent", w, MAX_INTENT_LEN)
    _context(m, w)
    for key in ("stream", "critical", "batch"):
        _bool(m, key, w)
    _bounded_int(m, "deadline_ms", w, 1, MAX_DEADLINE_MS)
    _bounded_int(m, "max_tokens", w, 1, MAX_TOKENS)
    _bounded_int(m, "seed", w, 0, 2**31 - 1)


def _validate_update(m: dict[str, Any]) -> None:
    w = "update_state"
    _only(m, frozenset({"t", "rid", "session", "state", "persona", "context"}), w)
    _int(m, "rid", w, minimum=1)
    _str(m, "session", w, MAX_ID_LEN)
    _str(m, "state", w, MAX_ID_LEN, optional=True)
    _persona(m, w)
    _context(m, w)
    if not m.keys() & {"state", "persona", "context"}:
        raise _bad(w, "needs 'state', 'persona' or 'context'")


def _validate_close(m: dict[str, Any]) -> None:
    _only(m, frozenset({"t", "rid", "session"}), "close_session")
    _int(m, "rid", "close_session", minimum=1)
    _str(m, "session", "close_session", MAX_ID_LEN)


def _validate_bye(m: dict[str, Any]) -> None:
    _only(m, frozenset({"t", "reason"}), "bye")
    _str(m, "reason", "bye", MAX_REASON_LEN, optional=True)


def _validate_welcome(m: dict[str, Any]) -> None:
    _only(m, frozenset({"t", "v", "player"}), "welcome")
    _int(m, "v", "welcome", minimum=1)
    _str(m, "player", "welcome", MAX_ID_LEN)


def _validate_session(m: dict[str, Any]) -> None:
    _only(m, frozenset({"t", "rid", "session"}), "session")
    _int(m, "rid", "session", minimum=1)
    _str(m, "session", "session", MAX_ID_LEN)


def _validate_piece(m: dict[str, Any]) -> None:
    _only(m, frozenset({"t", "rid", "text"}), "piece")
    _int(m, "rid", "piece", minimum=1)
    if not isinstance(m.get("text"), str) or len(m["text"]) > MAX_TEXT_LEN:
        raise _bad("piece", f"'text' must be a string of at most {MAX_TEXT_LEN} characters")


def _validate_line(m: dict[str, Any]) -> None:
    w = "line"
    _only(m, frozenset({"t", "rid", "session", "text", "fallback", "fallback_reason", "tokens",
                        "latency_ms", "ttft_ms", "cached_tokens"}), w)
    _int(m, "rid", w, minimum=1)
    _str(m, "session", w, MAX_ID_LEN)
    _validate_piece({"t": "piece", "rid": m["rid"], "text": m.get("text")})
    _bool(m, "fallback", w)
    if "fallback" not in m:
        raise _bad(w, "'fallback' is required")
    _str(m, "fallback_reason", w, MAX_ID_LEN, optional=True)
    _int(m, "tokens", w)
    _int(m, "cached_tokens", w, optional=True)
    for key in ("latency_ms", "ttft_ms"):
        v = m.get(key)
        if not (type(v) in (int, float) or (key == "ttft_ms" and v is None)):
            raise _bad(w, f"'{key}' must be a number")


def _validate_ok(m: dict[str, Any]) -> None:
    _only(m, frozenset({"t", "rid"}), "ok")
    _int(m, "rid", "ok", minimum=1)


def _validate_busy(m: dict[str, Any]) -> None:
    _only(m, frozenset({"t", "rid", "retry_after_ms"}), "busy")
    _int(m, "rid", "busy", minimum=1)
    _int(m, "retry_after_ms", "busy")


def _validate_error(m: dict[str, Any]) -> None:
    _only(m, frozenset({"t", "code", "reason", "rid"}), "error")
    _str(m, "code", "error", MAX_ID_LEN)
    _str(m, "reason", "error", MAX_REASON_LEN * 4)
    _int(m, "rid", "error", minimum=1, optional=True)


_CLIENT = {"hello": _validate_hello, "open_session": _validate_open,
           "request_line": _validate_request, "update_state": _validate_update,
           "close_session": _validate_close, "bye": _validate_bye}
_SERVER = {"welcome": _validate_welcome, "session": _validate_session, "piece": _validate_piece,
           "line": _validate_line, "ok": _validate_ok, "busy": _validate_busy,
           "error": _validate_error, "bye": _validate_bye}


def validate_dialogue_client(message: dict[str, Any]) -> dict[str, Any]:
    """Check a client -> server dialogue message against the schema; return it unchanged."""
    return validate_message(message, _CLIENT, "dialogue client to server")


def validate_dialogue_server(message: dict[str, Any]) -> dict[str, Any]:
    """Check a server -> client dialogue message against the schema; return it unchanged."""
    return validate_message(message, _SERVER, "dialogue server to client")


def decode_dialogue_client(frame: bytes | str) -> tuple[dict[str, Any], Codec]:
    """Decode and validate a frame the dialogue server received (ProtocolError if bad)."""
    return decode_validated(frame, _CLIENT, "dialogue client to server")


def decode_dialogue_server(frame: bytes | str) -> tuple[dict[str, Any], Codec]:
    """Decode and validate a frame a dialogue client received (ProtocolError if bad)."""
    return decode_validated(frame, _SERVER, "dialogue server to client")
