"""The example village: who lives where, and a scripted player walking through by day and night.

Used by ``flashnpc demo``, ``flashnpc inspect``, ``examples/pygame_village.py`` and the world
benchmark. The NPC trees are ``examples/village/*.xml`` (BehaviorTree.CPP v4; read from a
source checkout, as the other examples).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .world import World

__all__ = ["ROSTER", "VILLAGE_DIR", "PlayerScript", "Resident", "build_village", "village_tree"]

VILLAGE_DIR = Path(__file__).resolve().parent.parent / "examples" / "village"

STREET_SPACING = 9.0  # metres between two houses along the main street


@dataclass(frozen=True)
class Resident:
    """One villager: ``npc_id``, archetype, tree file (in ``examples/village/``), persona traits,
    initial blackboard entries and a display name."""

    npc_id: str
    name: str
    archetype: str
    tree: str
    persona: tuple[str, ...]
    blackboard: tuple[tuple[str, Any], ...] = ()


# The village, in the order its houses stand along the street; --npcs N takes the first N
# (cycling with numbered copies past the end).
ROSTER: tuple[Resident, ...] = (
    Resident("bram", "Bram", "guard", "guard.xml", ("gruff", "brave"),
             (("shift", "day"), ("location", "the gate"))),
    Resident("mira", "Mira", "merchant", "merchant.xml", ("cheerful", "greedy"), (("item", "silk"), ("location", "the market"))),
    Resident("oswin", "Oswin", "innkeeper", "innkeeper.xml", ("kind",), (("location", "the inn"),)),
    Resident("hilda", "Hilda", "blacksmith", "blacksmith.xml", ("proud",),
             (("item", "sword"), ("location", "the forge"))),
    Resident("tomas", "Tomas", "farmer", "farmer.xml", ("weary",), (("location", "the fields"),)),
    Resident("elric", "Brother Elric", "priest", "priest.xml", ("pious", "kind"),
             (("location", "the chapel"),)),
    Resident("pip", "Pip", "child", "child.xml", ("curious",), (("location", "the well"),)),
    Resident("vex", "Vex", "thief", "thief.xml", ("sly", "nervous"), (("location", "the alley"),)),
    Resident("gerd", "Gerd", "guard", "guard.xml", ("weary",),
             (("shift", "night"), ("location", "the barracks"))),
    Resident("sela", "Sela", "merchant", "merchant.xml", ("shy",), (("item", "spice"), ("location", "the docks"))),
)

# The dialogue wheel the scripted player uses, per archetype (in order, one per visit).
WHEEL: dict[str, tuple[str, ...]] = {
    "guard": ("greet", "ask_directions", "threaten"),
    "merchant": ("trade", "ask_rumors"),
    "innkeeper": ("ask_rumors", "greet"),
    "blacksmith": ("trade", "threaten"),
    "farmer": ("greet", "ask_directions"),
    "priest": ("ask_rumors",),
    "child": ("greet",),
    "thief": ("threaten", "ask_rumors"),
}


def village_tree(file: str) -> Path:
    """Path of ``examples/village/<file>`` in a source checkout."""
    path = VILLAGE_DIR / file
    if not path.is_file():
        raise FileNotFoundError(f"village tree {file!r} not found in {VILLAGE_DIR} (the village "
                                "runs from a source checkout: examples/ is not installed)")
    return path


def house_position(index: int) -> tuple[float, float]:
    """Where villager ``index`` stands: houses alternate on both sides of the street (y=0)."""
    return (8.0 + index * STREET_SPACING, 3.0 if index % 2 else -3.0)


def residents(n: int) -> list[Resident]:
    """The first ``n`` villagers of :data:`ROSTER` (numbered copies past its end)."""
    if n < 1:
        raise ValueError(f"a village needs at least one NPC, got {n}")
    out = []
    for i in range(n):
        base = ROSTER[i % len(ROSTER)]
        if i < len(ROSTER):
            out.append(base)
        else:
            k = i // len(ROSTER) + 1
            out.append(Resident(f"{base.npc_id}{k}", f"{base.name} {k}", base.archetype, base.tree,
                                base.persona, base.blackboard))
    return out


def build_village(world: World, n: int = 10) -> list[Resident]:
    """Add ``n`` villagers to ``world`` along the street; returns them in street order."""
    people = residents(n)
    for i, r in enumerate(people):
        world.add_npc(r.npc_id, r.archetype, village_tree(r.tree), persona=r.persona,
                      position=house_position(i), context=dict(r.blackboard))
    return people


def street_length(n: int) -> float:
    return house_position(n - 1)[0] + 8.0


@dataclass(frozen=True)
class Beat:
    """What the script does at one moment: ``kind`` is ``context`` (set time of day),
    ``player`` (add a player), ``talk`` or ``leave`` (remove a player)."""

    time: float
    kind: str
    args: tuple[Any, ...]


class PlayerScript:
    """A traveller ("Aria") walking the street by day (east) and by night (back west), stopping to
    talk to some villagers; at night a bandit (reputation ``hostile``) comes in from the east
    at twice her pace, overtakes her and leaves by the west end.

    ``positions(t)`` gives the players' positions at game time ``t``; ``beats`` lists the
    scripted calls in time order. The whole walk fits in ``duration`` seconds.
    """

    BANDIT_IN, BANDIT_OUT = 1.15, 1.7  # in halves of the duration: night is (1, 2)

    def __init__(self, people: list[Resident], duration: float) -> None:
        if not (math.isfinite(duration) and duration > 0):
            raise ValueError(f"duration must be positive, got {duration!r}")
        self.people = people
        self.duration = duration
        self.length = street_length(len(people))
        self.half = duration / 2
        beats = [Beat(0.0, "context", (("time_of_day", "day"),)),
                 Beat(0.0, "player", ("aria", "Aria", (0.0, 0.0), "friendly")),
                 Beat(self.half * 0.9, "context", (("time_of_day", "dusk"),)),
                 Beat(self.half, "context", (("time_of_day", "night"), ("weather", "fog"))),
                 # the name fills {player}: villagers call a bandit they don't know "stranger"
                 # ("Halt, stranger!"), not "a bandit" ("Oh, it's only you, a bandit!")
                 Beat(self.BANDIT_IN * self.half, "player", ("bandit", "stranger", (self.length, 1.0), "hostile"))]
        visits: dict[str, int] = {}
        for i, r in enumerate(people):
            wheel = WHEEL.get(r.archetype, ("greet",))
            if i % 2 == 0 or r.archetype in ("merchant", "thief"):
                for night in (False, True):
                    k = visits.get(r.archetype, 0)
                    visits[r.archetype] = k + 1
                    if night and i % 4:
                        continue
                    beats.append(Beat(self._arrival(i, night) + 0.3, "talk", (r.npc_id, "aria", wheel[k % len(wheel)])))
        beats.append(Beat(self.BANDIT_OUT * self.half, "leave", ("bandit",)))
        self.beats = sorted(beats, key=lambda b: b.time)

    def _x(self, t: float) -> float:
        if t < self.half:
            return self.length * t / self.half
        return self.length * max(0.0, 1.0 - (t - self.half) / self.half)

    def _arrival(self, index: int, night: bool) -> float:
        x = 8.0 + index * STREET_SPACING
        frac = x / self.length
        return self.half * (1.0 - frac) + self.half if night else self.half * frac

    def positions(self, t: float) -> dict[str, tuple[float, float]]:
        pos = {"aria": (self._x(t), 0.0)}
        if self.BANDIT_IN * self.half <= t < self.BANDIT_OUT * self.half:
            run = 2 * self.length / self.half * (t - self.BANDIT_IN * self.half)
            pos["bandit"] = (max(0.0, self.length - run), 1.0)
        return pos

    def run_beats(self, world: World, t0: float, t1: float) -> Iterator[Beat]:
        """Apply the beats in ``(t0, t1]`` (``[0, t1]`` when t0 < 0) to ``world``; yields each."""
        for beat in self.beats:
            if not (t0 < beat.time <= t1 or (t0 < 0 and beat.time == 0)):
                continue
            if beat.kind == "context":
                world.set_context(**dict(beat.args))
            elif beat.kind == "player":
                pid, name, pos, rep = beat.args
                if pid not in world.players:
                    world.add_player(pid, name, pos, reputation=rep)
            elif beat.kind == "talk":
                npc_id, pid, intent = beat.args
                if npc_id in world.npcs and pid in world.players:
                    world.talk(npc_id, pid, intent)
            elif beat.kind == "leave" and beat.args[0] in world.players:
                world.remove_player(beat.args[0])
            yield beat

    def move(self, world: World, t: float) -> None:
        for pid, pos in self.positions(t).items():
            if pid in world.players:
                world.move_player(pid, pos)
