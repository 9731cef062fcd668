"""Messages of the FlashNPC sync protocol (version 1), see docs/protocol.md.

Pure functions only: no sockets, no clocks. The frames, codecs (msgpack in binary frames, JSON
in text frames) and :class:`~server_sync.transport.wire.ProtocolError` are
:mod:`server_sync.transport.wire`'s, shared with the dialogue protocol.

Client -> server: ``hello``, ``intent``, ``resync``, ``bye``.
Server -> client: ``snapshot``, ``delta``, ``ack``, ``refused``, ``error``, ``bye``.

:data:`SYNC` is the table (:class:`~server_sync.transport.schema.Protocol`) the validators
run and the shipped JSON Schemas are generated from (:mod:`server_sync.schemas`).
:func:`decode_client` / :func:`decode_server` decode *and* validate: anything that is not
a well-formed message of the expected direction raises :class:`ProtocolError` whose
``code`` is one of :data:`~server_sync.transport.wire.ERROR_CODES` and whose ``reason`` names
the offending field.
"""

from __future__ import annotations

from typing import Any

from ..transport.schema import F, Int, ListOf, MapOf, Message, Num, Obj, Pos, Protocol, Scalar, Str
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
    "REFUSAL_RULES",
    "SYNC",
    "decode_client",
    "decode_server",
    "validate_client",
    "validate_server",
]

#: ``refused.rule`` values: the server-authority rule an intent broke (docs/protocol.md)
REFUSAL_RULES = ("unknown_npc", "not_in_area", "too_far", "unknown_intent", "too_fast",
                 "out_of_bounds")

_ID = Str(MAX_ID_LEN)
_STATE = MapOf(Scalar(), key=Str(MAX_ID_LEN), description="synced state keys -> values")
_NPC = Obj({"pos": F(Pos()), "state": F(_STATE)})
_NPCS = MapOf(_NPC, key=_ID, description="npc id -> {pos, state}")
_BYE = Message("bye", {"reason": F(Str(MAX_REASON_LEN), False, "why (optional)")},
               "client: the player leaves (session forgotten, token revoked); "
               "server: it is stopping")

SYNC = Protocol("sync", "FlashNPC sync protocol", PROTOCOL_VERSION, client=[
    Message("hello", {
        "v": F(Int(1), doc="protocol version (1)"),
        "token": F(Str(MAX_TOKEN_LEN), doc="auth token (a JWT)"),
        "pos": F(Pos(), False, "spawn position, used only if the server has none for the player"),
        "resume": F(Obj({"epoch": F(_ID), "seq": F(Int())}), False,
                    "epoch of the last snapshot and the last seq applied"),
    }, "first message of a connection"),
    Message("intent", {
        "cseq": F(Int(1), doc="the client's intent sequence number"),
        "pos": F(Pos(), False, "move the player here"),
        "talk": F(Obj({"npc": F(_ID), "intent": F(Str(MAX_INTENT_LEN))}), False,
                  "a dialogue choice: NPC id and a catalog intent"),
    }, "a player action", any_of=("pos", "talk")),
    Message("resync", {"seq": F(Int(), doc="the last seq the client applied")},
            "asks for a fresh snapshot"),
    _BYE,
], server=[
    Message("snapshot", {
        "v": F(Int(1)),
        "epoch": F(_ID, doc="changes whenever the server restarts"),
        "seq": F(Int(), doc="the next delta has seq + 1"),
        "time": F(Num(), doc="wall clock (ms since the Unix epoch) of the tick whose state this is"),
        "radius": F(Num(), doc="interest radius"),
        "tick_hz": F(Num(), doc="server ticks per second"),
        "pos": F(Pos(), doc="the player's position on the server"),
        "npcs": F(_NPCS, doc="every NPC in the player's area"),
    }, "the full state of the player's area"),
    Message("delta", {
        "seq": F(Int(1), doc="last seq + 1"),
        "time": F(Num(), doc="wall clock (ms since the Unix epoch) of the tick"),
        "leave": F(ListOf(_ID, 100_000), False, "NPCs that left the area"),
        "enter": F(_NPCS, False, "NPCs that entered the area, with full state"),
        "set": F(MapOf(_STATE, key=_ID), False, "npc id -> changed state keys"),
        "move": F(MapOf(Pos(), key=_ID), False, "npc id -> new position"),
        "pos": F(Pos(), False, "the server moved the player here (an admin move)"),
        "ack": F(Int(), False, "a cumulative ack riding along"),
    }, "the changes of one tick in the player's area"),
    Message("ack", {"cseq": F(Int(), doc="every intent with cseq <= this is processed and durable")},
            "cumulative acknowledgement"),
    Message("refused", {
        "cseq": F(Int(1), doc="the refused intent"),
        "rule": F(Str(MAX_ID_LEN, enum=REFUSAL_RULES), doc="the server-authority rule it broke"),
        "reason": F(Str(MAX_REASON_LEN * 4), doc="human-readable detail"),
        "pos": F(Pos(), False, "the player's position on the server (a refused move)"),
    }, "an intent the server did not apply (it is still acknowledged)"),
    Message("error", {
        "code": F(Str(MAX_ID_LEN, enum=tuple(sorted(ERROR_CODES)))),
        "reason": F(Str(MAX_REASON_LEN * 4)),
    }, "sent before the server closes the connection"),
    _BYE,
])

_decode_client = SYNC.decoder("client")
_decode_server = SYNC.decoder("server")


def validate_client(message: dict[str, Any]) -> dict[str, Any]:
    """Check a client -> server message against the schema; return it unchanged."""
    return SYNC.validate(message, "client")


def validate_server(message: dict[str, Any]) -> dict[str, Any]:
    """Check a server -> client message against the schema; return it unchanged."""
    return SYNC.validate(message, "server")


def decode_client(frame: bytes | str) -> tuple[dict[str, Any], Codec]:
    """Decode and validate a frame a server received."""
    return _decode_client(frame)


def decode_server(frame: bytes | str) -> tuple[dict[str, Any], Codec]:
    """Decode and validate a frame a client received."""
    return _decode_server(frame)
