"""Three ``flashnpc serve --redis`` processes, clients spread over them, churn, players crossing
area borders, and node n0 killed with kill -9 mid-run: its clients resume on the others, its
areas are taken over within the stated bound, nothing is lost, reordered or unapplied."""

from __future__ import annotations

import pytest

from server_sync.loadtest.cluster_loadtest import ClusterLoadConfig, run_cluster_loadtest

from .conftest import redis_required


@pytest.mark.slow
def test_three_nodes_lose_nothing_when_one_is_killed_mid_run(tmp_path):
    redis_required()
    cfg = ClusterLoadConfig(clients=30, duration=6.0, churn=0.3, npcs=60, changes=60.0,
                            size=500.0, radius=80.0, procs=1, move_hz=2.0, speed=20.0,
                            connect_rate=200.0, seed=3, out=str(tmp_path / "lt"),
                            settle_timeout=20.0, nodes=3, area_size=125.0, lease_ms=1000,
                            kill_node_at=2.5, hard_limit_s=240.0)
    report = run_cluster_loadtest(cfg, log=lambda *_: None)
    assert report["zero_lost_updates"], report
    assert report["gaps"] == report["mismatched_replicas"] == report["missing_clients"] == 0
    assert report["acked_intents_lost"] == 0 and report["unacked_intents"] == 0
    assert report["intents_pending_in_streams"] == 0 and report["cross_node_mismatches"] == 0
    assert report["border_crossings"] > 0  # players walked across area borders meanwhile
    assert report["killed_node"] == "n0" and report["victim_areas"] > 0
    assert report["takeover_s"] is not None
    assert report["takeover_s"] <= report["takeover_bound_s"], report["takeover_s"]
    killed, *alive = report["per_node"]
    assert killed["clients_at_end"] == 0  # n0's clients resumed on n1 and n2
    assert sum(n["clients_at_end"] for n in alive) == 30
    assert all(n["areas_owned_at_end"] > 0 for n in alive)
    assert report["reconnects"] >= 10  # the ten clients of n0, and the churned ones
