"""Generic game nodes the example trees use: MoveTo, NextWaypoint, PlayAnimation.

A game implements these against its engine (pathfinding, animation); these versions move in
tree-clock time and report animations to a listener, which is what the demos, the plugin's
village and the tests need. :func:`register_generic_nodes` adds them to a factory.
"""

from __future__ import annotations

from collections.abc import Callable

from .factory import Factory
from .node import StatefulAction, TreeNode
from .ports import BidirectionalPort, InputPort, OutputPort
from .status import Status

__all__ = ["ActionListener", "MoveTo", "register_generic_nodes"]

ActionListener = Callable[[TreeNode, str], None]


class MoveTo(StatefulAction):
    """Walk to ``goal``: RUNNING for ``seconds`` of tree-clock time, then SUCCESS,
    writing ``goal`` to the ``location`` output. The tree may sleep meanwhile."""

    __slots__ = ("arrive_at",)
    ports = (
        InputPort("goal", type=str, description="where to walk"),
        InputPort("seconds", type=float, default=10.0, description="walking time"),
        OutputPort("location", type=str, description="set to goal on arrival"),
    )

    def setup(self) -> None:
        self.arrive_at = 0.0

    def on_start(self) -> Status:
        self.arrive_at = self.now() + self.get_input("seconds")
        return self.on_running()

    def on_running(self) -> Status:
        remaining = self.arrive_at - self.now()
        if remaining > 0:
            self.sleep(remaining)
            return Status.RUNNING
        self.set_output("location", self.get_input("goal"))
        return Status.SUCCESS


def _next_waypoint(ctx: TreeNode) -> bool:
    """``route`` is ``"a;b;c"``; advances ``index`` (wrapping) and writes ``waypoint``."""
    route = [w.strip() for w in ctx.get_input("route").split(";") if w.strip()]
    if not route:
        raise ValueError(f"node {ctx.name!r}: empty route")
    index = (ctx.get_input("index", -1) + 1) % len(route)
    ctx.set_output("index", index)
    ctx.set_output("waypoint", route[index])
    return True


def register_generic_nodes(factory: Factory, on_action: ActionListener | None = None) -> Factory:
    """Register MoveTo, NextWaypoint and PlayAnimation on ``factory``.

    ``on_action(node, animation)`` is called when PlayAnimation runs (the
    game would start the animation there). Returns the factory.
    """

    def play_animation(ctx: TreeNode) -> bool:
        if on_action is not None:
            on_action(ctx, ctx.get_input("animation"))
        return True

    factory.register_action("MoveTo", MoveTo)
    factory.register_action(
        "NextWaypoint",
        _next_waypoint,
        ports=[
            InputPort("route", type=str, description="waypoints separated by ';'"),
            BidirectionalPort("index", type=int, description="position in the route"),
            OutputPort("waypoint", type=str, description="the next waypoint"),
        ],
    )
    factory.register_action(
        "PlayAnimation",
        play_animation,
        ports=[InputPort("animation", type=str, description="animation name")],
    )
    return factory
