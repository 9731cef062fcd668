"""Interest management: a uniform spatial grid answering "which NPCs are within r of p".

Cells are ``cell`` units wide (the server uses its interest radius), so a radius query
reads at most the 3 x 3 cells around the point when ``r <= cell``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

__all__ = ["SpatialGrid"]

Pos = tuple[float, float]


class SpatialGrid:
    """Points (id -> position) bucketed in square cells."""

    def __init__(self, cell: float) -> None:
        if not cell > 0:
            raise ValueError(f"grid cell size must be positive, got {cell}")
        self.cell = float(cell)
        self._cells: dict[tuple[int, int], set[str]] = {}
        self._pos: dict[str, Pos] = {}

    def __len__(self) -> int:
        return len(self._pos)

    def __contains__(self, item: object) -> bool:
        return item in self._pos

    def position(self, item: str) -> Pos:
        return self._pos[item]

    def _key(self, p: Pos) -> tuple[int, int]:
        return (math.floor(p[0] / self.cell), math.floor(p[1] / self.cell))

    def place(self, item: str, pos: Pos) -> None:
        """Insert ``item`` or move it to ``pos``."""
        pos = (float(pos[0]), float(pos[1]))
        old = self._pos.get(item)
        new_key = self._key(pos)
        if old is not None:
            old_key = self._key(old)
            if old_key == new_key:
                self._pos[item] = pos
                return
            bucket = self._cells[old_key]
            bucket.discard(item)
            if not bucket:
                del self._cells[old_key]
        self._pos[item] = pos
        self._cells.setdefault(new_key, set()).add(item)

    def remove(self, item: str) -> None:
        old = self._pos.pop(item, None)
        if old is None:
            return
        key = self._key(old)
        bucket = self._cells[key]
        bucket.discard(item)
        if not bucket:
            del self._cells[key]

    def near(self, pos: Pos, radius: float) -> Iterator[str]:
        """Every item whose distance to ``pos`` is <= ``radius``."""
        x, y = pos
        r2 = radius * radius
        c = self.cell
        x0, x1 = math.floor((x - radius) / c), math.floor((x + radius) / c)
        y0, y1 = math.floor((y - radius) / c), math.floor((y + radius) / c)
        cells, where = self._cells, self._pos
        for cx in range(x0, x1 + 1):
            for cy in range(y0, y1 + 1):
                bucket = cells.get((cx, cy))
                if not bucket:
                    continue
                for item in bucket:
                    px, py = where[item]
                    if (px - x) * (px - x) + (py - y) * (py - y) <= r2:
                        yield item
