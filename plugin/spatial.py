"""A uniform spatial hash grid for proximity queries (which NPCs are near this player?).

Keys live in square cells of side ``cell_size``; a query of radius ``r`` looks only at the
cells overlapping the square around the point, so its cost depends on how many keys are
nearby, not on how many exist. Iteration order is insertion order (cells are dicts), which
keeps worlds deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator

__all__ = ["SpatialHash"]


class SpatialHash:
    """Points (``key -> (x, y)``) bucketed by cell.

    ``insert``/``move``/``remove`` are O(1); ``candidates(x, y, r)`` yields every key whose cell
    overlaps the square of half-side ``r`` around (x, y) (a superset of the keys within ``r``);
    ``query(x, y, r)`` keeps only those within distance ``r``.
    """

    __slots__ = ("_cell_of", "_cells", "_pos", "cell_size")

    def __init__(self, cell_size: float) -> None:
        if not (isinstance(cell_size, (int, float)) and math.isfinite(cell_size) and cell_size > 0):
            raise ValueError(f"cell_size must be a positive finite number, got {cell_size!r}")
        self.cell_size = float(cell_size)
        self._cells: dict[tuple[int, int], dict[Hashable, None]] = {}
        self._cell_of: dict[Hashable, tuple[int, int]] = {}
        self._pos: dict[Hashable, tuple[float, float]] = {}

    def __len__(self) -> int:
        return len(self._pos)

    def __contains__(self, key: object) -> bool:
        return key in self._pos

    def _cell(self, x: float, y: float) -> tuple[int, int]:
        s = self.cell_size
        return (math.floor(x / s), math.floor(y / s))

    def position(self, key: Hashable) -> tuple[float, float]:
        return self._pos[key]

    def insert(self, key: Hashable, x: float, y: float) -> None:
        if key in self._pos:
            raise KeyError(f"{key!r} is already in the grid")
        c = self._cell(x, y)
        self._cells.setdefault(c, {})[key] = None
        self._cell_of[key] = c
        self._pos[key] = (x, y)

    def move(self, key: Hashable, x: float, y: float) -> None:
        old = self._cell_of[key]
        self._pos[key] = (x, y)
        c = self._cell(x, y)
        if c != old:
            bucket = self._cells[old]
            del bucket[key]
            if not bucket:
                del self._cells[old]
            self._cells.setdefault(c, {})[key] = None
            self._cell_of[key] = c

    def remove(self, key: Hashable) -> None:
        c = self._cell_of.pop(key)
        del self._pos[key]
        bucket = self._cells[c]
        del bucket[key]
        if not bucket:
            del self._cells[c]

    def candidates(self, x: float, y: float, r: float) -> Iterator[Hashable]:
        s = self.cell_size
        x0, x1 = math.floor((x - r) / s), math.floor((x + r) / s)
        y0, y1 = math.floor((y - r) / s), math.floor((y + r) / s)
        cells = self._cells
        for cx in range(x0, x1 + 1):
            for cy in range(y0, y1 + 1):
                bucket = cells.get((cx, cy))
                if bucket:
                    yield from bucket

    def query(self, x: float, y: float, r: float) -> list[Hashable]:
        """Keys within distance ``r`` of (x, y), in grid order."""
        r2 = r * r
        pos = self._pos
        out = []
        for key in self.candidates(x, y, r):
            px, py = pos[key]
            dx, dy = px - x, py - y
            if dx * dx + dy * dy <= r2:
                out.append(key)
        return out
