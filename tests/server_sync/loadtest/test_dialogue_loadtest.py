"""``flashnpc loadtest dialogue``: the vLLM-style figures from request records, and a short
real run over loopback with the tiny model."""

from __future__ import annotations

import json

import pytest

from server_sync.loadtest.dialogue_loadtest import (
    DialogueLoadConfig,
    run_dialogue_loadtest,
    summarize,
)
from tests.runtime.conftest import copy_tiny_model


def test_summary_figures_follow_from_the_records():
    records = [  # (sent, first piece, end, kind, tokens, fallback reason, piece times)
        (0.0, 0.010, 0.040, "line", 4, "", [0.010, 0.020, 0.030, 0.040]),
        (1.0, 1.100, 1.400, "line", 2, "", [1.100, 1.400]),
        (2.0, None, 2.050, "fallback", 0, "deadline", []),
        (3.0, None, 3.001, "busy", 0, "", []),
        (4.0, None, None, "lost", 0, "", []),
    ]
    r = summarize(records, 10.0, slo_ttft_ms=50.0, slo_e2el_ms=1000.0)
    assert (r["completed"], r["model_lines"], r["busy"], r["errors"]) == (3, 2, 1, 1)
    assert r["fallback_reasons"] == {"deadline": 1} and r["error_kinds"] == {"lost": 1}
    assert r["request_throughput"] == pytest.approx(0.3)
    assert r["output_throughput"] == pytest.approx(0.6)
    assert r["goodput"] == pytest.approx(0.1)  # the second line misses the TTFT SLO
    assert r["mean_ttft_ms"] == pytest.approx(55.0)
    assert r["median_tpot_ms"] == pytest.approx((10.0 + 300.0) / 2)
    assert r["mean_itl_ms"] == pytest.approx((10 + 10 + 10 + 300) / 4)
    assert r["mean_e2el_ms"] == pytest.approx((40 + 400 + 50) / 3)
    with pytest.raises(ValueError, match="duration_s"):
        summarize(records, 0.0, slo_ttft_ms=1, slo_e2el_ms=1)


def test_unstreamed_lines_meet_the_slo_on_e2el_alone():
    records = [(0.0, None, 0.200, "line", 5, "", []), (1.0, None, 2.5, "line", 5, "", [])]
    r = summarize(records, 10.0, slo_ttft_ms=50.0, slo_e2el_ms=1000.0)
    assert r["goodput"] == pytest.approx(0.1)  # the first within 1,000 ms; no TTFT to judge
    assert r["output_throughput"] == pytest.approx(1.0)


def test_a_short_run_answers_every_request_and_writes_report_and_plot(tiny_model_build, tmp_path):
    model = copy_tiny_model(tiny_model_build, tmp_path / "model")
    cfg = DialogueLoadConfig(sessions=24, rate=30.0, duration=2.0, procs=2, max_batch=16,
                             model_dir=str(model), deadline_ms=5000, out=str(tmp_path / "lt"))
    report = run_dialogue_loadtest(cfg, log=lambda *_: None)
    assert report["errors"] == 0 and report["busy"] == 0
    assert report["completed"] == report["requests"] > 0
    assert report["server"]["health"]["service"]["sessions"] == 0  # closed as clients left
    saved = json.loads((tmp_path / "lt" / "report.json").read_text())
    assert saved["completed"] == report["completed"]
    assert (tmp_path / "lt" / "plot.png").stat().st_size > 0


def test_an_unbounded_run_is_refused():
    with pytest.raises(ValueError, match="duration"):
        run_dialogue_loadtest(DialogueLoadConfig(duration=3600.0))
