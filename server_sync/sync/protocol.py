"""Messages of the FlashNPC sync protocol (version 1), see docs/protocol.md.

Pure functions only: no sockets, no clocks. The frames, codecs (msgpack in binary frames, JSON
in text frames) and :class:`~server_sync.transport.wire.ProtocolError` are
:mod:`server_sync.transport.wire`'s, shared with the dialogue protocol.

Client -> server: ``hello``, ``intent``, ``resync``, ``bye``.
Server -> client: ``snapshot``, ``delta``, ``ack``, ``error``, ``bye``.

:func:`decode_client` / :func:`decode_server` decode *and* validate: anything that is not
a well-formed message of the expected direction raises :class:`ProtocolError` whose
``code`` is one of :data:`~server_sync.transport.wire.ERROR_CODES` and whose ``reason`` names
the offending field.
"""

from __future__ import annotations

import math
from typing import Any

from ..transport.wire import (
    MAX_ID_LEN,
    MAX_INTENT_LEN,
    MAX_REASON_LEN,
    MAX_TOKEN_LEN,
    Codec,
    _bad,
    _int,
    _only,
    _str,
    decode_validated,
    validate_message,
)

__all__ = [
    "decode_client",
    "decode_server",
    "validate_client",
    "validate_server",
]

# ---- schema ------------------------------------------------------------------------------

def _pos(v: Any, where: str) -> None:
    if not (isinstance(v, (list, tuple)) and len(v) == 2
            and all(type(c) in (int, float) and math.isfinite(c) for c in v)):
        raise _bad(where, f"a position must be [x, y] with finite numbers, got {v!r:.60}")


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


def validate_client(message: dict[str, Any]) -> dict[str, Any]:
    """Check a client -> server message against the schema; return it unchanged."""
    return validate_message(message, _CLIENT, "client to server")


def validate_server(message: dict[str, Any]) -> dict[str, Any]:
    """Check a server -> client message against the schema; return it unchanged."""
    return validate_message(message, _SERVER, "server to client")


def decode_client(frame: bytes | str) -> tuple[dict[str, Any], Codec]:
    """Decode and validate a frame a server received."""
    return decode_validated(frame, _CLIENT, "client to server")


def decode_server(frame: bytes | str) -> tuple[dict[str, Any], Codec]:
    """Decode and validate a frame a client received."""
    return decode_validated(frame, _SERVER, "server to client")
