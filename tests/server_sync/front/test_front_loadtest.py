"""``flashnpc loadtest dialogue --front``: a short run through real nginx before two real
workers answers every request and reports the figures overall and per worker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from server_sync.loadtest.dialogue_loadtest import DialogueLoadConfig, run_dialogue_loadtest
from tests.server_sync.conftest import SECRET


def test_a_run_through_the_front_reports_every_worker_and_answers_every_request(
        front, workers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FLASHNPC_SECRET", SECRET.decode())
    _, _, url = front([w.worker for w in workers[:2]])
    http = tuple(f"http://127.0.0.1:{w.worker.http_port}" for w in workers[:2])
    cfg = DialogueLoadConfig(sessions=16, rate=16.0, duration=2.0, procs=1, deadline_ms=3000,
                             front=url, workers_http=http, out=str(tmp_path / "lt"))
    report = run_dialogue_loadtest(cfg, log=lambda *_: None)
    assert report["errors"] == 0 and report["completed"] == report["requests"] > 0
    per = report["workers"]
    assert set(per) == {"w0", "w1"}
    assert sum(r["completed"] for r in per.values()) == report["completed"]
    assert sum(r["total_output_tokens"] for r in per.values()) == report["total_output_tokens"]
    assert set(report["server"]) == set(http)
    assert all(v["health"]["status"] in ("ready", "degraded") for v in report["server"].values())
    assert json.loads((tmp_path / "lt" / "report.json").read_text())["workers"].keys() == per.keys()


def test_a_front_that_is_no_websocket_url_is_refused(tmp_path: Path):
    cfg = DialogueLoadConfig(front="http://127.0.0.1:8080", out=str(tmp_path))
    with pytest.raises(ValueError, match="expected a ws:// or wss:// URL"):
        run_dialogue_loadtest(cfg)
