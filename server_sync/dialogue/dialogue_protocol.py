"""Wire format of FlashNPC dialogue over WebSockets (version 1), see docs/protocol.md.

Pure functions only, like :mod:`server_sync.sync.protocol`, on the same wire format
(:mod:`server_sync.transport.wire`: msgpack in binary frames, JSON in text frames, and
:class:`~server_sync.transport.wire.ProtocolError`).

Client -> server: ``hello``, ``open_session``, ``request_line``, ``update_state``,
``close_session``, ``cancel``, ``bye``. Every message but ``hello`` and ``bye`` carries
``rid``, the client's request id (an integer >= 1), which the server's answer repeats;
``cancel`` names the ``rid`` of a ``request_line`` in flight.

Server -> client: ``welcome`` (answers ``hello``), ``session`` (answers ``open_session``),
``piece`` (streamed text of a ``request_line``), ``line`` (the finished line), ``ok``
(answers ``update_state`` / ``close_session``), ``busy`` (with ``retry_after_ms``),
``error`` (with ``rid`` when it concerns one request; without, the connection closes),
``bye``.

:data:`DIALOGUE` is the table the validators run and the shipped JSON Schemas are generated
from (:mod:`server_sync.schemas`).
"""

from __future__ import annotations

from typing import Any

from ..transport.schema import Bool, F, Int, ListOf, MapOf, Message, Nullable, Num, Protocol, Str
from ..transport.wire import (
    ERROR_CODES,
    MAX_ID_LEN,
    MAX_INTENT_LEN,
    MAX_REASON_LEN,
    MAX_TOKEN_LEN,
    PROTOCOL_VERSION,
    Codec,
)

__all__ = [
    "DIALOGUE",
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
    "cancelled",         # the client cancelled this request_line
})

_ID = Str(MAX_ID_LEN)
_RID = F(Int(1), doc="the client's request id, repeated in the answer")
_SESSION = F(_ID, doc="a session id this connection opened")
_PERSONA = ListOf(_ID, MAX_PERSONA, "trait names")
_CONTEXT = MapOf(Str(MAX_VALUE_LEN), key=_ID, max_items=MAX_CONTEXT_ENTRIES,
                 description="context slot -> value (catalog words; free-text slots any text)")
_TEXT = Str(MAX_TEXT_LEN, 0)
_BYE = Message("bye", {"reason": F(Str(MAX_REASON_LEN), False)}, "the sender is leaving")

DIALOGUE = Protocol("dialogue", "FlashNPC dialogue protocol", DIALOGUE_PROTOCOL_VERSION, client=[
    Message("hello", {"v": F(Int(1)), "token": F(Str(MAX_TOKEN_LEN), doc="auth token (a JWT)")},
            "first message of a connection"),
    Message("open_session", {
        "rid": _RID, "archetype": F(_ID), "state": F(_ID),
        "persona": F(_PERSONA, False), "context": F(_CONTEXT, False),
        "model": F(_ID, False, "the served model to use (default 'base')"),
        "essential": F(Bool(), False, "false: the capacity rule may serve it by a fallback model "
                                      "or authored lines (default true)"),
    }, "open a dialogue session with one NPC"),
    Message("request_line", {
        "rid": _RID, "session": _SESSION, "intent": F(Str(MAX_INTENT_LEN)),
        "context": F(_CONTEXT, False, "merged over the session's context for this line"),
        "stream": F(Bool(), False, "send piece messages as the line decodes (default false)"),
        "deadline_ms": F(Int(1, MAX_DEADLINE_MS), False),
        "critical": F(Bool(), False, "bypass an open circuit breaker (default false)"),
        "batch": F(Bool(), False, "false: the one-at-a-time lane (default true)"),
        "seed": F(Int(0, 2**31 - 1), False),
        "max_tokens": F(Int(1, MAX_TOKENS), False),
    }, "ask for one line"),
    Message("update_state", {
        "rid": _RID, "session": _SESSION, "state": F(_ID, False),
        "persona": F(_PERSONA, False), "context": F(_CONTEXT, False, "merged"),
    }, "change the session's NPC state, persona or context",
        any_of=("state", "persona", "context")),
    Message("close_session", {"rid": _RID, "session": _SESSION}, "close a session"),
    Message("cancel", {"rid": F(Int(1), doc="the rid of a request_line in flight")},
            "cancel a request_line: it is answered error cancelled"),
    _BYE,
], server=[
    Message("welcome", {"v": F(Int(1)), "player": F(_ID, doc="the token's subject"),
                        "worker": F(_ID, False, "the worker's id (serve --worker-id), behind a front")},
            "the hello was accepted"),
    Message("session", {"rid": _RID, "session": _SESSION,
                        "model": F(_ID, False, "the model serving the session")}, "answers open_session"),
    Message("piece", {"rid": _RID, "text": F(_TEXT)}, "streamed text of a request_line"),
    Message("line", {
        "rid": _RID, "session": _SESSION, "text": F(_TEXT),
        "fallback": F(Bool(), doc="true: an authored line"),
        "fallback_reason": F(_ID, False),
        "tokens": F(Int(), doc="decoded tokens"),
        "latency_ms": F(Num()), "ttft_ms": F(Nullable(Num())),
        "cached_tokens": F(Int(), False),
        "served_by": F(_ID, False, "the model that produced the text, or 'authored'"),
    }, "the finished line"),
    Message("ok", {"rid": _RID}, "answers update_state and close_session"),
    Message("busy", {"rid": _RID, "retry_after_ms": F(Int())}, "not taken: ask again later"),
    Message("error", {
        "code": F(Str(MAX_ID_LEN, enum=tuple(sorted(ERROR_CODES | REQUEST_ERROR_CODES)))),
        "reason": F(Str(MAX_REASON_LEN * 4)),
        "rid": F(Int(1), False, "present: concerns one request, the connection stays"),
    }, "without rid the connection closes next"),
    _BYE,
])

_decode_client = DIALOGUE.decoder("client")
_decode_server = DIALOGUE.decoder("server")


def validate_dialogue_client(message: dict[str, Any]) -> dict[str, Any]:
    """Check a client -> server dialogue message against the schema; return it unchanged."""
    return DIALOGUE.validate(message, "client")


def validate_dialogue_server(message: dict[str, Any]) -> dict[str, Any]:
    """Check a server -> client dialogue message against the schema; return it unchanged."""
    return DIALOGUE.validate(message, "server")


def decode_dialogue_client(frame: bytes | str) -> tuple[dict[str, Any], Codec]:
    """Decode and validate a frame the dialogue server received (ProtocolError if bad)."""
    return _decode_client(frame)


def decode_dialogue_server(frame: bytes | str) -> tuple[dict[str, Any], Codec]:
    """Decode and validate a frame a dialogue client received (ProtocolError if bad)."""
    return _decode_server(frame)
