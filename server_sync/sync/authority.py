"""Server authority: which intents the sync server applies (docs/protocol.md, "Server authority").

Pure rules, no I/O. An intent is applied whole or refused whole; a refusal names the rule:

* ``out_of_bounds``: a move must end inside the world's bounds;
* ``too_fast``: a move may cover at most what the player's movement budget holds: the budget
  fills at ``max_speed`` units per second of server time up to ``max_speed * move_burst_s``
  and each move spends its straight-line length (so moves that arrive bunched up in one tick
  are not refused, and a player cannot bank a teleport);
* ``unknown_npc``: a talk must name an NPC of the world;
* ``unknown_intent``: a talk's intent must be in the world's catalog;
* ``not_in_area``: the NPC must be in the player's area (what its client can see);
* ``too_far``: the NPC must be within ``talk_range`` of the player.

Positions are checked where the player stands on the server (after the intent's own move).
Teleports are admin moves only (``POST /admin/teleport``): they skip the speed rule.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass

__all__ = ["Bounds", "MoveBudget", "Refusal", "Rules", "bounds_around"]

Pos = tuple[float, float]
Bounds = tuple[float, float, float, float]  # x0, y0, x1, y1


@dataclass(frozen=True)
class Refusal:
    """Why an intent was not applied: ``rule`` (one of the module docstring's) and a reason."""

    rule: str
    reason: str


def bounds_around(points: Iterable[Pos], margin: float) -> Bounds:
    """The box around ``points`` grown by ``margin`` on every side (a world's default bounds:
    its NPCs grown by the interest radius); ``(-margin, -margin, margin, margin)`` if none."""
    xs, ys = [], []
    for x, y in points:
        xs.append(x)
        ys.append(y)
    if not xs:
        return (-margin, -margin, margin, margin)
    return (min(xs) - margin, min(ys) - margin, max(xs) + margin, max(ys) + margin)


class MoveBudget:
    """A player's movement allowance (see ``too_fast`` in the module docstring)."""

    __slots__ = ("at", "units")

    def __init__(self, units: float, at: float) -> None:
        self.units = units
        self.at = at


@dataclass(frozen=True)
class Rules:
    """The server-authority settings of one world."""

    bounds: Bounds
    intents: Collection[str]
    radius: float
    talk_range: float
    max_speed: float = 50.0
    move_burst_s: float = 2.0

    def __post_init__(self) -> None:
        x0, y0, x1, y1 = self.bounds
        if not (all(math.isfinite(v) for v in self.bounds) and x0 <= x1 and y0 <= y1):
            raise ValueError(f"world bounds must be finite x0 <= x1, y0 <= y1, got {self.bounds}")
        if not (self.max_speed > 0 and self.move_burst_s > 0 and self.talk_range > 0):
            raise ValueError("max_speed, move_burst_s and talk_range must be > 0")

    @property
    def move_cap(self) -> float:
        return self.max_speed * self.move_burst_s

    def new_budget(self, now: float) -> MoveBudget:
        return MoveBudget(self.move_cap, now)

    def inside(self, pos: Pos) -> bool:
        x0, y0, x1, y1 = self.bounds
        return x0 <= pos[0] <= x1 and y0 <= pos[1] <= y1

    def clamp(self, pos: Pos) -> Pos:
        x0, y0, x1, y1 = self.bounds
        return (min(max(pos[0], x0), x1), min(max(pos[1], y0), y1))

    def out_of_bounds(self, pos: Pos) -> Refusal | None:
        if self.inside(pos):
            return None
        x0, y0, x1, y1 = self.bounds
        return Refusal("out_of_bounds", f"({pos[0]:.6g}, {pos[1]:.6g}) is outside the world "
                                        f"(x {x0:g}..{x1:g}, y {y0:g}..{y1:g})")

    def check_move(self, budget: MoveBudget, here: Pos, to: Pos, now: float) -> Refusal | None:
        """Refuse a move from ``here`` to ``to`` at server time ``now``, or spend its length
        from ``budget`` and return None."""
        refusal = self.out_of_bounds(to)
        if refusal is not None:
            return refusal
        units = min(self.move_cap, budget.units + max(0.0, now - budget.at) * self.max_speed)
        budget.at = max(budget.at, now)
        dist = math.hypot(to[0] - here[0], to[1] - here[1])
        if dist > units + 1e-9:
            budget.units = units
            return Refusal("too_fast", f"a move of {dist:.1f} units; the player may move "
                                       f"{units:.1f} now (max speed {self.max_speed:g} units/s, "
                                       f"{self.move_burst_s:g} s of it banked at most)")
        budget.units = units - dist
        return None

    def check_talk(self, npc: str, intent: str, npc_pos: Pos | None, here: Pos,
                   in_area: bool) -> Refusal | None:
        """Refuse a talk to ``npc`` (at ``npc_pos``, None: no such NPC) by a player at
        ``here``; ``in_area``: the NPC is in the player's area."""
        if npc_pos is None:
            return Refusal("unknown_npc", f"there is no NPC {npc[:64]!r}")
        if intent not in self.intents:
            return Refusal("unknown_intent", f"{intent[:32]!r} is not an intent of the catalog "
                                             f"({', '.join(sorted(self.intents))})")
        dist = math.hypot(npc_pos[0] - here[0], npc_pos[1] - here[1])
        if not in_area and dist > self.radius:
            return Refusal("not_in_area", f"NPC {npc!r} is not in the player's area "
                                          f"({dist:.1f} units away, radius {self.radius:g})")
        if dist > self.talk_range:
            return Refusal("too_far", f"NPC {npc!r} is {dist:.1f} units away (talk range "
                                      f"{self.talk_range:g})")
        return None
