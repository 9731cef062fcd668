"""Events a :class:`plugin.World` hands back from ``update`` (and to ``on`` callbacks).

Every event is a frozen dataclass deriving from :class:`Event`; ``time`` is the world's game
time (seconds) when the event became ready. ``world.on(Event, cb)`` receives all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Event", "Line", "LineDropped", "LinePiece", "StateChanged"]


@dataclass(frozen=True, slots=True)
class Event:
    """Base class of every world event."""


@dataclass(frozen=True, slots=True)
class Line(Event):
    """An NPC says ``text`` to ``player_id`` (None for a line spoken to nobody in particular).

    ``state`` is the NPC's behavior state the line was generated for (always the NPC's state
    at delivery: stale lines are never delivered, see docs/plugin.md); ``intent`` the player's
    move (``approach`` when the player walked up); ``latency_ms`` request to line, as measured
    by the engine; ``fallback`` an authored line replaced the model's (``fallback_reason``
    says why); ``request_id`` matches :meth:`plugin.World.talk`'s return value;
    ``regenerated`` counts how many times the request was re-issued after a state change.
    """

    npc_id: Any
    player_id: Any
    text: str
    state: str
    latency_ms: float
    fallback: bool
    intent: str = "approach"
    archetype: str = ""
    request_id: int = 0
    ttft_ms: float | None = None
    prefix_cache_hit: bool = False
    fallback_reason: str | None = None
    regenerated: int = 0
    time: float = 0.0


@dataclass(frozen=True, slots=True)
class StateChanged(Event):
    """A blackboard key of an NPC's tree changed value (keys the world itself writes, such as
    ``player_near``, and ``_private`` keys are not reported). ``remote``: the NPC is remote
    (client mode), so the change came from the server through
    :meth:`plugin.World.apply_remote_state`."""

    npc_id: Any
    key: str
    old: Any
    new: Any
    time: float = 0.0
    remote: bool = False


@dataclass(frozen=True, slots=True)
class LinePiece(Event):
    """Streaming only (``World(stream=True)``): more text of a line being decoded.

    ``text`` is everything shown so far; ``piece`` the part new in this event. The finished
    :class:`Line` follows (with the full text), or a :class:`LineDropped` if the line went stale.
    """

    npc_id: Any
    player_id: Any
    request_id: int
    piece: str
    text: str
    time: float = 0.0


@dataclass(frozen=True, slots=True)
class LineDropped(Event):
    """A requested line will not be delivered.

    ``reason``: ``stale`` (the NPC's state changed while it was in flight; a regenerated
    request may follow, see ``regenerating``), ``superseded`` (the player talked to the NPC,
    which replaces an ambient line), ``out_of_range`` (the player walked away before the
    request could be sent), ``error`` (the engine failed).
    """

    npc_id: Any
    player_id: Any
    request_id: int
    reason: str
    regenerating: bool = False
    time: float = 0.0
