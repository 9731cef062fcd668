"""A headless behavior-tree demo: a village guard through an evening.

``run_demo()`` loads ``examples/trees/guard.xml``, ticks it with a scripted
fake clock while the "game" changes the blackboard (a player approaches,
night falls, a hostile prowls, the shift ends), and prints for every tick the
events, the blackboard changes seen by an observer, what the guard did, and a
compact trace of the nodes that ran. It ends with the tree as a Mermaid
flowchart coloured by what each node returned on the last tick.

The generic nodes the example trees use (MoveTo, NextWaypoint, PlayAnimation)
live in :mod:`behavior_tree.generic_nodes`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from .display import statuses_from_trace, to_mermaid
from .factory import Factory
from .generic_nodes import MoveTo, register_generic_nodes
from .status import Status
from .tree import Tree

__all__ = [
    "EXAMPLES_DIR",
    "MoveTo",
    "ScriptedEvent",
    "example_path",
    "guard_scenario",
    "register_generic_nodes",
    "run_demo",
]

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples" / "trees"
TICK_SECONDS = 10.0  # game time between two demo ticks: a whole evening in a dozen ticks

def example_path(name: str) -> Path:
    """Path of ``examples/trees/<name>`` in a source checkout."""
    path = EXAMPLES_DIR / name
    if not path.is_file():
        raise FileNotFoundError(
            f"example tree {name!r} not found in {EXAMPLES_DIR} (the demo runs from a source "
            "checkout: the examples/ folder is not part of the installed package)"
        )
    return path


# --------------------------------------------------------------------------- scenario


@dataclass(frozen=True)
class ScriptedEvent:
    """Something the game does to the blackboard before tick ``tick``."""

    tick: int
    text: str
    changes: dict[str, Any] = field(default_factory=dict)


def guard_scenario(seed: int, ticks: int) -> list[ScriptedEvent]:
    """The evening's events, spread over ``ticks`` (events past the end never happen).

    The seed picks the hostile and shifts each beat by up to one tick; the
    order of the beats is fixed, so the story always makes sense.
    """
    rng = random.Random(seed)
    hostile = rng.choice(["a wolf", "a bandit", "a wild boar", "a goblin"])
    beats = [
        (0.25, "a player walks up to the gate", {"player_near": True}),
        (0.40, "night falls", {"is_night": True}),
        (0.55, "the player walks away", {"player_near": False}),
        (0.65, f"{hostile} prowls by the walls", {"hostile_near": True}),
        (0.75, f"{hostile} runs off", {"hostile_near": False}),
        (0.85, "the shift ends", {"on_duty": False}),
    ]
    events: list[ScriptedEvent] = []
    last = 1
    for fraction, text, changes in beats:
        tick = max(last + 1, round(fraction * ticks) + rng.choice((-1, 0, 0, 1)))
        events.append(ScriptedEvent(tick, text, changes))
        last = tick
    return events


GUARD_START: dict[str, Any] = {
    "hostile_near": False,
    "player_near": False,
    "is_night": False,
    "on_duty": True,
    "alarms": 0,
    "state": "idle",
    "location": "barracks",
}

_SHORT = {
    Status.SUCCESS: "ok",
    Status.FAILURE: "FAILED",
    Status.RUNNING: "running",
    Status.SKIPPED: "skipped",
}


def _compact_trace(tree: Tree) -> str:
    """Leaves whose status changed this tick, in order, with what they returned,
    then leaves still RUNNING from before, then the root's status."""
    trace = tree.trace
    if trace is None or not trace.records:
        return ""
    leaves = {node.uid: node for node in tree.nodes() if not node.children}
    returned: dict[int, Status] = {}
    for transition in trace.records[-1].transitions:
        if transition.new is not Status.IDLE and transition.uid in leaves:
            returned[transition.uid] = transition.new
    for uid, node in leaves.items():
        if node.status is Status.RUNNING and uid not in returned:
            returned[uid] = Status.RUNNING
    parts = [f"{leaves[uid].name} {_SHORT[status]}" for uid, status in returned.items()]
    parts.append(f"=> {tree.root.name} {tree.root.status.name}")
    return " | ".join(parts)


def run_demo(seed: int = 0, ticks: int = 12, out: TextIO | None = None) -> int:
    """Run the guard demo, printing to ``out`` (stdout by default). Returns 0.

    Deterministic: the same seed and tick count print the same text.
    """
    if ticks < 1:
        raise ValueError(f"ticks must be at least 1, got {ticks}")
    write: Callable[[str], Any] = print if out is None else (lambda s: out.write(s + "\n"))

    now = 0.0
    actions: list[str] = []
    factory = register_generic_nodes(
        Factory(), on_action=lambda node, animation: actions.append(animation)
    )
    path = example_path("guard.xml")
    definition = factory.load_file(path)
    tree = definition.instantiate(clock=lambda: now)
    bb = tree.blackboard
    for key, value in GUARD_START.items():
        bb.set(key, value)

    changes: list[tuple[str, Any, Any]] = []
    bb.observe(lambda key, old, new: changes.append((key, old, new)))
    tree.enable_trace(max_ticks=ticks)
    tree.track_reads = True  # a sleeping tree wakes when a key it read changes
    events = {event.tick: event for event in guard_scenario(seed, ticks)}

    write(
        f"FlashNPC behavior-tree demo: a village guard (examples/trees/{path.name}), "
        f"seed {seed}, {ticks} ticks, {TICK_SECONDS:g} s of game time per tick"
    )
    write("  keys the game sets: " + ", ".join(f"{k}={v!r}" for k, v in GUARD_START.items()))
    write("")
    for tick in range(1, ticks + 1):
        now = tick * TICK_SECONDS
        event = events.get(tick)
        head = f"tick {tick:>2}  t={now:>4.0f}s"
        if event is not None:
            write(f"{head}  >> {event.text}")
            for key, value in event.changes.items():
                bb.set(key, value)
            changes.clear()  # the event line already says what the game changed
        else:
            write(head)
        if not tree.is_due(now):
            write("    asleep: not ticked")
            continue
        actions.clear()
        tree.tick()
        for key, old, new in changes:
            write(f"    {key}: {old!r} -> {new!r}")
        changes.clear()
        if actions:
            write("    does: " + ", ".join(actions))
        write("    trace: " + _compact_trace(tree))
        if tree.asleep:
            until = f"t={tree.wake_deadline:.0f}s" if tree.wake_deadline < math.inf else "never"
            write(f"    sleeps until {until}, or until a key it read changes")
        for error in tree.errors:
            write(f"    error: {error}")
        tree.errors.clear()

    write("")
    write(
        f"after {ticks} ticks: state={bb.get('state')!r}, location={bb.get('location')!r}, "
        f"alarms raised={bb.get('alarms')}"
    )
    write("")
    write("The tree, coloured by what each node returned on the last tick")
    write("(paste into a ```mermaid block; grey idle, orange running, green success,")
    write(" red failure, light blue skipped):")
    write("")
    trace = tree.trace
    statuses = statuses_from_trace(trace.records[-1]) if trace and trace.records else None
    write(to_mermaid(tree, statuses=statuses).rstrip("\n"))
    return 0
