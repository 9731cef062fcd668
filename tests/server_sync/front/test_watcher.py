"""The health watcher and what passes through the front unchanged: a worker whose breaker
opens (/health 503) is marked down and its keys go elsewhere; back to 200, it is put back;
the breaker's fallback lines and ``busy`` replies reach the client as the worker sent them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runtime.serving.dialogue_service import CircuitBreaker
from server_sync.dialogue.client import Busy, Line
from server_sync.dialogue.front import FrontConfig, HealthWatcher, Worker, parse_workers
from tests.server_sync.conftest import until

from .conftest import address, client, eventually, free_port, in_process_worker, workers_of

KEYS = [f"k{i}" for i in range(40)]


async def test_the_watcher_takes_a_worker_with_an_open_breaker_out_and_puts_it_back(front):
    breaker = CircuitBreaker(p95_budget_ms=1e-6, min_requests=1, cooldown_s=0.3, probes=1)
    async with in_process_worker("good") as good, in_process_worker("sick", breaker=breaker) as sick:
        nginx, cfg, url = front([address(good), address(sick)])
        changes: list[frozenset[str]] = []
        watcher = HealthWatcher(cfg, nginx.conf, nginx.reload, interval_s=0.05, fall=1, rise=2,
                                on_change=changes.append)
        task = asyncio.create_task(watcher.run())
        try:
            await until(lambda: watcher.reloads == 1, what="the watcher's first round")
            placed = await workers_of(url, KEYS)
            sick_keys = [k for k in KEYS if placed[k] == "sick"]
            assert sick_keys and len(sick_keys) < len(KEYS)
            held = client(url, sick_keys[0])
            await held.connect()
            session = await held.open_session("guard", "idle")
            first = await session.request_line("greet")  # slower than 1e-6 ms: opens the breaker
            assert first.fallback_reason != "breaker_open" and first.worker == "sick"
            shed = await session.request_line("greet")
            assert (shed.fallback, shed.fallback_reason, shed.worker) == (True, "breaker_open", "sick")

            out = frozenset({address(sick).address})
            await until(lambda: changes[-1:] == [out], what="sick taken out")
            assert f"server {address(sick).address} max_fails=1 fail_timeout=5s down;" \
                in nginx.conf.read_text()

            async def all_on(worker: str) -> bool:
                return set((await workers_of(url, sick_keys)).values()) == {worker}

            await eventually(lambda: all_on("good"),
                             what="the sick worker's keys on the good one")
            assert watcher.snapshot()["workers"][address(sick).address]["last"] == "degraded (503)"

            breaker.p95_budget_ms = 1e9  # the model is fast again: after the cool-down a probe
            await until(lambda: breaker.snapshot()["state"] == "half_open", what="half-open")
            probe = await session.request_line("greet")  # the held connection stays on "sick"
            assert probe.fallback_reason != "breaker_open" and probe.worker == "sick"
            await until(lambda: changes[-1] == frozenset(), what="sick put back")
            await eventually(lambda: all_on("sick"), what="the sick worker's keys back on it")
            assert changes == [frozenset(), out, frozenset()]  # the first round writes what it saw
            await held.close()
        finally:
            task.cancel()


async def test_busy_replies_pass_through_the_front_with_their_retry_after(front):
    async with in_process_worker("only", max_inflight_per_conn=1) as srv:
        _, _, url = front([address(srv)])
        c = client(url, "busy-key")
        await c.connect()
        session = await c.open_session("guard", "idle")
        # (a generous deadline: on a loaded machine a line past the default one is a fallback)
        results = await asyncio.gather(*[session.request_line("greet", max_tokens=48, deadline_ms=30_000)
                                         for _ in range(6)], return_exceptions=True)
        busy = [r for r in results if isinstance(r, Busy)]
        lines = [r for r in results if isinstance(r, Line)]
        assert busy and lines and len(busy) + len(lines) == len(results)
        assert len(busy) == srv.busy_total
        assert all(b.retry_after_ms >= 0 for b in busy)
        assert all(x.worker == "only" and x.fallback_reason is None for x in lines)
        await c.close()


async def test_when_every_worker_is_unhealthy_none_is_marked_down(tmp_path: Path):
    dead = parse_workers(f"127.0.0.1:{free_port()}:{free_port()},127.0.0.1:{free_port()}:{free_port()}")
    reloads: list[int] = []
    watcher = HealthWatcher(FrontConfig(dead), tmp_path / "front.conf", lambda: reloads.append(1),
                            interval_s=0.05, timeout_s=0.5)
    import aiohttp

    async with aiohttp.ClientSession() as http:
        assert await watcher.poll_once(http)  # first round: writes and reloads once
        assert watcher.down == frozenset() and not await watcher.poll_once(http)
    assert all(not s.up for s in watcher.states.values()) and reloads == [1]
    assert " down;" not in (tmp_path / "front.conf").read_text()


def test_a_bad_worker_spec_names_the_item():
    with pytest.raises(ValueError, match=r"--workers '127.0.0.1:8767': expected HOST:PORT:HTTP_PORT"):
        parse_workers("127.0.0.1:8767")
    with pytest.raises(ValueError, match="listed twice"):
        parse_workers("h:1:2,h:1:3")
    with pytest.raises(ValueError, match="keepalive ping"):
        FrontConfig([Worker("h", 1, 2)], idle_timeout_s=10)
