"""Garbage-collection policy for processes that hold thousands of connections.

CPython's automatic full (generation 2) collections scan every live object; with thousands
of connections' objects they stalled the sync server's ticks (and the load generator's
receive loops) for up to 0.7 s. :class:`GcPolicy` freezes the survivors every
``freeze_every_s`` (automatic full collections then scan only recent objects) and runs one
real full sweep every ``sweep_every_s`` (it collects cyclic garbage among frozen objects).
It also records how long every full collection took, for ``/admin/stats`` and reports.
"""

from __future__ import annotations

import gc
import time
from typing import Any

__all__ = ["GcPolicy"]


class GcPolicy:
    """Call :meth:`start` once, :meth:`step` often (each tick), :meth:`stop` at the end.

    ``freeze_every_s=0`` turns freezing and sweeping off (only the timing stays)."""

    def __init__(self, freeze_every_s: float = 1.0, sweep_every_s: float = 300.0) -> None:
        self.freeze_every_s = freeze_every_s
        self.sweep_every_s = sweep_every_s
        self.full_seconds: list[float] = []  # durations of full (gen 2) collections
        self._started = 0.0
        self._froze_at = self._swept_at = 0.0

    def start(self) -> None:
        gc.callbacks.append(self._on_gc)
        if self.freeze_every_s:
            gc.collect()
            gc.freeze()
        self._froze_at = self._swept_at = time.monotonic()

    def step(self) -> None:
        if not self.freeze_every_s:
            return
        now = time.monotonic()
        if self.sweep_every_s and now - self._swept_at >= self.sweep_every_s:
            self._swept_at = self._froze_at = now
            gc.unfreeze()
            gc.collect()
            gc.freeze()
        elif now - self._froze_at >= self.freeze_every_s:
            self._froze_at = now
            gc.collect(1)  # young garbage goes first; survivors are frozen
            gc.freeze()

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self.freeze_every_s:
            gc.unfreeze()

    def stats(self) -> dict[str, float]:
        """Full collections so far: count, total and longest, in ms."""
        s = self.full_seconds
        return {"n": len(s), "total_ms": 1000.0 * sum(s), "max_ms": 1000.0 * max(s, default=0.0)}

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.full_seconds.append(time.perf_counter() - self._started)
