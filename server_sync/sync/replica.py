"""The client's sans-I/O half: a local replica of the NPCs in range, fed by server messages.

:meth:`Replica.apply` takes one validated server message and returns what changed as
:class:`Change` records (for callbacks). It enforces ordering: a delta whose ``seq`` is not
exactly ``last seq + 1`` is not applied; :meth:`apply` raises :class:`GapError` and the
client answers with ``{"t": "resync", "seq": replica.seq}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Change", "GapError", "Replica"]


class GapError(Exception):
    """A delta arrived out of order (missed or repeated seq); ask the server to resync."""

    def __init__(self, expected: int, got: int) -> None:
        super().__init__(f"expected delta seq {expected}, got {got}")
        self.expected = expected
        self.got = got


@dataclass(frozen=True)
class Change:
    """``kind``: 'enter' | 'leave' | 'set' | 'move' | 'reset' (a snapshot replaced all).
    For 'set', ``key``/``old``/``new`` name the changed synced key."""

    kind: str
    npc_id: str
    key: str | None = None
    old: Any = None
    new: Any = None


class Replica:
    """NPCs in range: ``npcs[id] = {"pos": [x, y], "state": {key: value}}``; ``player_pos``:
    where the server has the player (from the snapshot, and deltas of admin moves)."""

    def __init__(self) -> None:
        self.epoch: str | None = None
        self.seq = -1  # nothing received yet
        self.npcs: dict[str, dict[str, Any]] = {}
        self.radius: float | None = None
        self.player_pos: list[float] | None = None

    @property
    def synced(self) -> bool:
        return self.epoch is not None

    def resume_token(self) -> dict[str, Any] | None:
        """The ``resume`` field for the next hello (None before the first snapshot)."""
        return None if self.epoch is None else {"epoch": self.epoch, "seq": self.seq}

    def apply(self, msg: dict[str, Any]) -> list[Change]:
        t = msg["t"]
        if t == "snapshot":
            return self._snapshot(msg)
        if t == "delta":
            return self._delta(msg)
        return []

    def _snapshot(self, msg: dict[str, Any]) -> list[Change]:
        self.epoch = msg["epoch"]
        self.seq = msg["seq"]
        self.radius = msg["radius"]
        self.player_pos = list(msg["pos"])
        self.npcs = {n: {"pos": list(e["pos"]), "state": dict(e["state"])}
                     for n, e in msg["npcs"].items()}
        return [Change("reset", "")] + [Change("enter", n) for n in self.npcs]

    def _delta(self, msg: dict[str, Any]) -> list[Change]:
        if self.epoch is None or msg["seq"] != self.seq + 1:
            raise GapError(self.seq + 1, msg["seq"])
        self.seq = msg["seq"]
        out: list[Change] = []
        npcs = self.npcs
        if "pos" in msg:
            self.player_pos = list(msg["pos"])
        for n in msg.get("leave", ()):
            if npcs.pop(n, None) is not None:
                out.append(Change("leave", n))
        for n, e in msg.get("enter", {}).items():
            npcs[n] = {"pos": list(e["pos"]), "state": dict(e["state"])}
            out.append(Change("enter", n))
        for n, ch in msg.get("set", {}).items():
            entry = npcs.get(n)
            if entry is None:
                continue
            state = entry["state"]
            for k, v in ch.items():
                out.append(Change("set", n, k, state.get(k), v))
                state[k] = v
        for n, p in msg.get("move", {}).items():
            entry = npcs.get(n)
            if entry is not None:
                entry["pos"] = list(p)
                out.append(Change("move", n, None, None, list(p)))
        return out
