"""Plugin fixtures: a tiny exported Flash model (built by the runtime tests' helper) and
generators over it. The tiny model's lines are unusable, so its lines are authored fallbacks;
the world logic under test does not care."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.conftest import copy_tiny_model


@pytest.fixture(scope="session")
def plugin_model_dir(tiny_model_build: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_tiny_model(tiny_model_build, tmp_path_factory.mktemp("plugin_flash"))


@pytest.fixture
def generator(plugin_model_dir: Path) -> Iterator[Any]:
    from runtime.client.generator import LineGenerator

    gen = LineGenerator.load(plugin_model_dir)
    yield gen
    gen.close()


class GatedGenerator:
    """The real generator behind a gate: ``submit`` only records the request and returns a
    Future that ``release()`` completes (with a real line from ``generate``), so tests decide
    exactly when a line in flight finishes."""

    def __init__(self, gen: Any) -> None:
        self.gen = gen
        self.pending: list[tuple[Future[Any], str, str, dict[str, Any]]] = []
        self.submitted: list[tuple[str, str, dict[str, Any]]] = []

    def catalog(self) -> dict[str, Any]:
        return self.gen.catalog()

    def submit(self, npc: str, state: str, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        self.pending.append((fut, npc, state, kwargs))
        self.submitted.append((npc, state, kwargs))
        return fut

    def poll(self) -> list[Any]:
        return []

    def release(self) -> int:
        pending, self.pending = self.pending, []
        for fut, npc, state, kwargs in pending:
            fut.set_result(self.gen.generate(npc, state, **kwargs))
        return len(pending)

    def stats(self) -> dict[str, Any]:
        return self.gen.stats()


@pytest.fixture
def gated(generator: Any) -> GatedGenerator:
    return GatedGenerator(generator)

