"""Every Prometheus metric the project exposes follows one naming convention (docs/metrics.md):
the ``flashnpc_`` prefix, ``_total`` on counters, base units in the name (``_seconds``,
``_bytes``), ratios in 0-1 named ``_ratio`` (never a percent), durations as histograms."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

NAME = re.compile(r"^flashnpc_[a-z0-9]+(_[a-z0-9]+)*$")
DURATION_WORDS = ("latency", "duration", "time_to")


def check(families: Iterable[Metric]) -> list[str]:
    """The names among ``families`` that break the convention, each with why."""
    problems = []
    for fam in families:
        samples = {s.name for s in fam.samples}
        name = fam.name
        if not NAME.match(name):
            problems.append(f"{name}: not flashnpc_snake_case")
        if "percent" in name or "pct" in name:
            problems.append(f"{name}: a percent; expose a 0-1 ratio named _ratio")
        if fam.type == "counter" and not all(s.endswith(("_total", "_created")) for s in samples):
            problems.append(f"{name}: counter samples must end in _total")
        if fam.type != "counter" and name.endswith("_total"):
            problems.append(f"{name}: only counters end in _total")
        is_duration = any(w in name for w in DURATION_WORDS) or name.endswith("_seconds")
        if is_duration and (fam.type != "histogram" or not name.endswith("_seconds")):
            problems.append(f"{name}: a duration must be a histogram named ..._seconds")
        if "bytes" in name and not name.endswith("_bytes"):
            problems.append(f"{name}: bytes is a unit and goes last (..._bytes[_total])")
        if fam.type == "gauge" and name.endswith("_ratio"):
            bad = [s.value for s in fam.samples if not 0.0 <= s.value <= 1.0]
            if bad:
                problems.append(f"{name}: ratio outside 0-1: {bad}")
    return problems


DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def undocumented(families: Iterable[Metric]) -> list[str]:
    """The exposed names docs/metrics.md does not list (as `name`, `name_total` or `name{...}`)."""
    listed = set(re.findall(r"`(flashnpc_[a-z0-9_]+)", DOC.read_text(encoding="utf-8")))
    missing = []
    for fam in families:
        names = {fam.name, fam.name + "_total"} if fam.type == "counter" else {fam.name}
        if not names & listed:
            missing.append(fam.name)
    return missing


def _families(registry: CollectorRegistry) -> list[Metric]:
    return list(registry.collect())


def test_checker_catches_the_old_names() -> None:
    from prometheus_client import Gauge

    reg = CollectorRegistry()
    Gauge("flash_active_params_percent", "old", registry=reg).set(21.5)
    Gauge("flashnpc_sync_tick_seconds", "old", registry=reg).set(0.01)
    assert len(check(_families(reg))) >= 3


def test_client_engine_metrics() -> None:
    from runtime import LineGenerator

    gen = LineGenerator.load(name="names")  # the shipped model
    gen.generate("guard", "patrol", seed=1)
    assert check(_families(gen.metrics_registry)) == []
    assert undocumented(_families(gen.metrics_registry)) == []
    assert 0 < gen.metrics.value("flashnpc_active_params_ratio") < 1
    gen.close()


def test_sync_server_metrics_and_its_tick_histogram() -> None:
    from server_sync.cli import build_world
    from server_sync.sync.http_port import _Collector
    from server_sync.sync.server import ServerConfig, SyncServer

    server = SyncServer(build_world("sim:5"), ServerConfig(secret=b"s" * 32))
    for seconds in (0.002, 0.004, 0.2):
        server.tick_duration.observe(seconds)
    families = list(_Collector(server).collect())
    assert check(families) == []
    assert undocumented(families) == []
    hist = next(f for f in families if f.name == "flashnpc_sync_tick_duration_seconds")
    assert hist.type == "histogram"
    count = next(s.value for s in hist.samples if s.name.endswith("_count"))
    assert count == 3
    assert not any(f.name == "flashnpc_sync_tick_seconds" for f in families)


def test_serving_and_dialogue_server_metrics() -> None:
    pytest.importorskip("torch")
    from aiohttp import ClientSession
    from prometheus_client.parser import text_string_to_metric_families

    from runtime.serving.dialogue_service import ServiceMetrics
    from server_sync.dialogue.dialogue_server import _start_http

    metrics = ServiceMetrics("names")
    metrics.set_active_params_percent(21.5)
    assert check(_families(metrics.registry)) == []
    assert undocumented(_families(metrics.registry)) == []
    assert metrics.value("flashnpc_active_params_ratio") == pytest.approx(0.215)

    fake = SimpleNamespace(conns={}, connections_total=1, lines_total=2, fallbacks_total=0, busy_total=0,
                           frames_out=3, bytes_out=40, errors=Counter({"bad": 1}),
                           messages=Counter({"hello": 1}),
                           service=SimpleNamespace(exposition=lambda: b""),
                           health=lambda: {"status": "ready"})

    async def scrape() -> str:
        runner, port = await _start_http(fake, "127.0.0.1", 0)  # type: ignore[arg-type]
        try:
            async with ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as r:
                return await r.text()
        finally:
            await runner.cleanup()

    families = list(text_string_to_metric_families(asyncio.run(scrape())))
    assert {f.name for f in families} >= {"flashnpc_dialogue_sent_bytes", "flashnpc_dialogue_clients"}
    assert check(families) == []
    assert undocumented(families) == []
