"""Run the servers' and load generators' event loops, on uvloop where it is installed.

uvloop (libuv) runs the same asyncio code with cheaper transports and callbacks; on the
sync load test it cut the server's CPU per frame sent (BENCHMARKS.md, "Server sync").
It is the ``server`` extra (``pip install 'flashnpc[server]'``); without it the standard
loop runs, so a game client never needs it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

__all__ = ["LOOPS", "loop_name", "run"]

T = TypeVar("T")
Loop = Literal["auto", "uvloop", "asyncio"]
LOOPS: tuple[str, ...] = ("auto", "uvloop", "asyncio")


def loop_name(loop: str = "auto") -> str:
    """The loop ``run(.., loop=loop)`` would use: ``"uvloop"`` or ``"asyncio"``; ValueError
    when ``uvloop`` is asked for and is not installed, or ``loop`` is not one of LOOPS."""
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {', '.join(LOOPS)}, got {loop!r}")
    if loop == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if loop == "uvloop":
            raise ValueError("loop 'uvloop' asked for but uvloop is not installed "
                             "(pip install 'flashnpc[server]')") from None
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T], *, loop: str = "auto") -> T:
    """``asyncio.run(main)`` on the loop that ``loop_name(loop)`` names."""
    if loop_name(loop) == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
