"""`flashnpc demo` end to end, and the spatial grid against brute force."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugin.cli import main
from plugin.spatial import SpatialHash


def test_flashnpc_demo_runs_the_village_end_to_end(plugin_model_dir: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["demo", "--model", str(plugin_model_dir), "--npcs", "3", "--duration", "30",
               "--seed", "2"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "3 NPCs" in out and "time_of_day is now night" in out
    spoken = [line for line in out.splitlines() if "] Bram (guard, " in line]
    assert spoken and all(" -> Aria [" in line and " ms" in line for line in spoken)
    summary = out[out.index("summary"):]
    for row in ("lines spoken", "latency p50", "latency p99", "prefix-cache hit rate", "fallback lines"):
        assert row in summary
    n = int(summary.split("lines spoken")[1].split()[0])
    assert n == sum(1 for line in out.splitlines() if " -> Aria [" in line or " -> a bandit [" in line)


def test_flashnpc_demo_rejects_a_bad_npc_count(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--npcs", "0"]) == 2
    assert "--npcs" in capsys.readouterr().err


def test_flashnpc_demo_names_a_missing_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--model", str(tmp_path / "nothing")]) == 1
    assert "nothing" in capsys.readouterr().err


points = st.lists(st.tuples(st.floats(-50, 50), st.floats(-50, 50)), max_size=60)


@settings(max_examples=60, deadline=None)
@given(points, st.tuples(st.floats(-60, 60), st.floats(-60, 60)), st.floats(0.1, 30),
       st.floats(0.5, 20))
def test_grid_query_matches_brute_force(pts: list[tuple[float, float]], q: tuple[float, float],
                                        r: float, cell: float) -> None:
    grid = SpatialHash(cell)
    for i, (x, y) in enumerate(pts):
        grid.insert(i, x, y)
    # move half of them somewhere else and back into a new place
    for i in range(0, len(pts), 2):
        x, y = pts[i]
        pts[i] = (y, x)
        grid.move(i, y, x)
    want = {i for i, (x, y) in enumerate(pts) if math.hypot(x - q[0], y - q[1]) <= r}
    got = set(grid.query(q[0], q[1], r))
    # points exactly on the circle may differ by rounding between hypot and dx*dx+dy*dy
    edge = {i for i, (x, y) in enumerate(pts) if abs(math.hypot(x - q[0], y - q[1]) - r) < 1e-9}
    assert got - edge == want - edge


def test_grid_remove_and_bad_cell_size() -> None:
    grid = SpatialHash(4.0)
    grid.insert("a", 1, 1)
    grid.insert("b", 9, 9)
    with pytest.raises(KeyError):
        grid.insert("a", 0, 0)
    grid.remove("a")
    assert grid.query(0, 0, 5) == [] and len(grid) == 1 and "b" in grid
    with pytest.raises(ValueError, match="cell_size"):
        SpatialHash(math.nan)


def test_village_trees_run_a_day_and_night_without_errors(generator: object) -> None:
    import io

    from plugin.demo import run_village

    result = run_village(generator, seed=1, npcs=10, duration=40.0, out=io.StringIO())
    world = result["world"]
    assert {npc.id: npc.tree.errors for npc in world.npcs.values() if npc.tree.errors} == {}
    states = {e.state for e in result["transcript"]}
    assert {"alert", "rest"} <= states  # night: guards turn alert at the traveller, others rest


SHIPPED = Path(__file__).resolve().parents[2] / "runtime" / "assets" / "flash" / "model.int4.onnx"


@pytest.mark.skipif(not SHIPPED.is_file(), reason="the shipped model is not in this checkout")
def test_world_without_a_generator_speaks_with_the_shipped_model() -> None:
    from plugin import Line, World

    with World(seed=3, deterministic=True) as world:
        world.add_npc("bram", "guard", "<root BTCPP_format='4'><BehaviorTree ID='G'>"
                      "<Script code=\"state := 'alert'\"/></BehaviorTree></root>", position=(0, 0))
        world.add_player("p", "Aria", (1, 0))
        spoken = [e for _ in range(5) for e in world.update(0.1) if isinstance(e, Line)]
        assert world.generator.stats()["model_loaded"] is True
    assert len(spoken) == 1 and spoken[0].state == "alert" and spoken[0].text.strip()
