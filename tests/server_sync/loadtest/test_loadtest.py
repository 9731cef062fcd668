"""The load-test harness end to end at toy scale: server process, worker process, churn,
verification, JSON report and PNG plot."""

import json

import pytest

from server_sync.loadtest.sync_loadtest import LoadConfig, run_loadtest


@pytest.mark.slow
def test_a_small_load_test_verifies_every_replica_and_writes_its_report(tmp_path):
    cfg = LoadConfig(clients=30, duration=2.0, churn=0.3, npcs=60, changes=60.0, size=400.0,
                     radius=80.0, procs=1, move_hz=2.0, connect_rate=200.0, seed=3,
                     out=str(tmp_path / "lt"), settle_timeout=20.0)
    report = run_loadtest(cfg, log=lambda *_: None)
    assert report["zero_lost_updates"], report
    assert report["connected_max"] == 30
    assert report["churned_clients"] == 9 and report["reconnects"] >= 9
    assert report["server_resumes"] + report["server_snapshots"] >= 9
    assert report["state_changes_per_s"] > 0 and report["latency_ms"]["samples"] > 0
    assert report["bytes_reduction_x"] > 1
    saved = json.loads((tmp_path / "lt" / "report.json").read_text())
    assert saved["mismatched_replicas"] == 0
    assert (tmp_path / "lt" / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
