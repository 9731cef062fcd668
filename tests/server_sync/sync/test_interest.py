"""The spatial grid answers radius queries exactly, through moves and removals."""

import random

import pytest

from server_sync.sync.interest import SpatialGrid


def brute(points, pos, r):
    return {k for k, (x, y) in points.items() if (x - pos[0]) ** 2 + (y - pos[1]) ** 2 <= r * r}


@pytest.mark.parametrize("seed", range(5))
def test_near_matches_a_brute_force_scan_after_moves(seed):
    rng = random.Random(seed)
    grid = SpatialGrid(25.0)
    points = {}
    for k in range(300):
        points[f"n{k}"] = (rng.uniform(-200, 200), rng.uniform(-200, 200))
        grid.place(f"n{k}", points[f"n{k}"])
    for k in rng.sample(range(300), 100):
        points[f"n{k}"] = (rng.uniform(-200, 200), rng.uniform(-200, 200))
        grid.place(f"n{k}", points[f"n{k}"])
    for k in rng.sample(range(300), 50):
        grid.remove(f"n{k}")
        del points[f"n{k}"]
    for _ in range(50):
        pos = (rng.uniform(-220, 220), rng.uniform(-220, 220))
        r = rng.choice([10.0, 25.0, 60.0])
        assert set(grid.near(pos, r)) == brute(points, pos, r)
    assert len(grid) == len(points)


def test_a_point_exactly_on_the_radius_is_inside():
    grid = SpatialGrid(10.0)
    grid.place("a", (3.0, 4.0))
    assert list(grid.near((0.0, 0.0), 5.0)) == ["a"]


def test_cell_size_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        SpatialGrid(0)
