"""The asyncio API of the client engine (``agenerate``, ``astream``): the same engine as the
threaded one, awaited from an event loop; cancellation reaches the model, errors reach the
caller, and many coroutines share the worker threads."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from runtime import AsyncLineStream, Line, LineGenerator

PROMPT: dict[str, Any] = dict(persona=["gruff"], intent="greet", context={"time_of_day": "night"})


@pytest.fixture(scope="module")
def shipped() -> Iterator[LineGenerator]:
    gen = LineGenerator.load(workers=2)
    yield gen
    gen.close()


class Slowed:
    """The generator's model with every step delayed, its steps counted."""

    def __init__(self, gen: LineGenerator, monkeypatch: pytest.MonkeyPatch, delay_s: float = 0.02) -> None:
        self.steps = 0
        self.lock = threading.Lock()
        step = gen.model.step

        def slow(*args: Any, **kwargs: Any) -> Any:
            time.sleep(delay_s)
            with self.lock:
                self.steps += 1
            return step(*args, **kwargs)

        monkeypatch.setattr(gen.model, "step", slow)

    async def wait_for_steps(self, n: int, timeout_s: float = 10.0) -> None:
        give_up = time.monotonic() + timeout_s
        while self.steps < n:
            assert time.monotonic() < give_up, f"only {self.steps} model steps"
            await asyncio.sleep(0.005)

    async def settled(self) -> int:
        """The step count once it stops moving (two step times without a step)."""
        last = -1
        while last != self.steps:
            last = self.steps
            await asyncio.sleep(0.1)
        return last


async def test_agenerate_gives_the_line_generate_gives(shipped: LineGenerator) -> None:
    line = await shipped.agenerate("guard", "alert", seed=1, **PROMPT)
    assert isinstance(line, Line) and not line.fallback and line.text.strip()
    again = LineGenerator.load()
    try:
        assert again.generate("guard", "alert", seed=1, **PROMPT).text == line.text
    finally:
        again.close()


async def test_astream_pieces_make_up_the_line(shipped: LineGenerator) -> None:
    stream = shipped.astream("merchant", "working", seed=4, intent="trade")
    assert isinstance(stream, AsyncLineStream)
    pieces = [piece async for piece in stream]
    assert stream.line is not None and not stream.line.fallback
    assert len(pieces) > 1 and "".join(pieces) == stream.line.text
    with pytest.raises(RuntimeError, match="iterated once"):
        stream.__aiter__()


async def test_many_concurrent_agenerate_calls_complete(shipped: LineGenerator) -> None:
    arches = ("guard", "merchant", "innkeeper", "farmer", "child")
    lines = await asyncio.gather(*(shipped.agenerate(arches[i % 5], "idle", seed=i, npc_id=i)
                                   for i in range(60)))
    assert len(lines) == 60 and all(line.text.strip() for line in lines)
    assert sum(not line.fallback for line in lines) >= 50
    assert not shipped._pending and not shipped._done  # nothing kept for poll(), nothing leaked


async def test_the_loop_stays_free_while_a_line_decodes(shipped: LineGenerator, monkeypatch) -> None:
    Slowed(shipped, monkeypatch, delay_s=0.01)
    ticks = 0

    async def heartbeat() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    beat = asyncio.create_task(heartbeat())
    await shipped.agenerate("guard", "patrol", seed=2, min_tokens=12)
    beat.cancel()
    assert ticks >= 5  # the loop ran other tasks while the worker decoded


async def test_cancelling_agenerate_stops_the_model(shipped: LineGenerator, monkeypatch) -> None:
    slowed = Slowed(shipped, monkeypatch)
    lines_before = shipped.metrics.value("flashnpc_lines_total", source="model")
    task = asyncio.create_task(shipped.agenerate("guard", "patrol", seed=3, min_tokens=40, max_tokens=48))
    await slowed.wait_for_steps(3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    at_cancel = slowed.steps
    assert await slowed.settled() <= at_cancel + 2  # the worker stopped at its next token
    assert slowed.steps < 30
    assert shipped.metrics.value("flashnpc_lines_total", source="model") == lines_before
    assert not shipped._pending
    line = await shipped.agenerate("guard", "patrol", seed=3)  # the worker is free again
    assert line.text.strip()


async def test_cancelling_an_astream_cancels_the_request(shipped: LineGenerator, monkeypatch) -> None:
    slowed = Slowed(shipped, monkeypatch)
    got: list[str] = []

    async def listen() -> None:
        async for piece in shipped.astream("innkeeper", "idle", seed=5, min_tokens=40, max_tokens=48):
            got.append(piece)

    task = asyncio.create_task(listen())
    await slowed.wait_for_steps(4)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    at_cancel = slowed.steps
    assert await slowed.settled() <= at_cancel + 2
    assert slowed.steps < 30


async def test_leaving_an_astream_early_cancels_the_request(shipped: LineGenerator, monkeypatch) -> None:
    slowed = Slowed(shipped, monkeypatch)
    stream = shipped.astream("farmer", "working", seed=6, min_tokens=40, max_tokens=48)
    async for _piece in stream:
        break  # the first piece is enough
    stream.cancel()  # what the generator's finaliser does too, once it is collected
    at_exit = slowed.steps
    assert await slowed.settled() <= at_exit + 2
    assert slowed.steps < 40


async def test_invalid_requests_raise_at_the_call(shipped: LineGenerator) -> None:
    with pytest.raises(ValueError, match="archetype"):
        await shipped.agenerate("dragon", "idle")
    with pytest.raises(ValueError, match="archetype"):
        shipped.astream("dragon", "idle")


async def test_an_engine_error_reaches_the_awaiting_caller(shipped: LineGenerator, monkeypatch) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("engine bug")

    monkeypatch.setattr(shipped, "_serve", broken)
    monkeypatch.setattr(shipped.fallbacks, "pick", broken)  # not even a fallback line
    with pytest.raises(RuntimeError, match="engine bug"):
        await shipped.agenerate("guard", "idle", seed=1)

    def attempts(*_args: Any, **_kwargs: Any) -> Iterator[str]:
        yield "Halt"
        raise RuntimeError("stream bug")

    monkeypatch.setattr(shipped, "_attempts", attempts)
    got: list[str] = []
    with pytest.raises(RuntimeError, match="stream bug"):
        async for piece in shipped.astream("guard", "idle", seed=1):
            got.append(piece)
    assert got == ["Halt"]


async def test_a_deadline_is_kept_while_the_workers_are_busy(monkeypatch) -> None:
    gen = LineGenerator.load(workers=1)
    try:
        Slowed(gen, monkeypatch, delay_s=0.05)
        busy = asyncio.create_task(gen.agenerate("guard", "patrol", seed=1, min_tokens=20))
        await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        line = await gen.agenerate("guard", "patrol", seed=2, deadline_ms=100)
        waited = time.perf_counter() - t0
        assert line.fallback and line.fallback_reason == "deadline" and line.text.strip()
        assert waited < 0.5  # answered at its deadline, not when the busy worker came free
        busy.cancel()
        with pytest.raises(asyncio.CancelledError):
            await busy
    finally:
        gen.close()
