"""The dialogue tests' tiny model (random weights, line-book tokenizer, built once a module)
and a service over it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.client.constraints import read_constraints
from runtime.client.fallback import FallbackBook
from runtime.serving.batched_engine import BatchedEngine, load_flash
from runtime.serving.dialogue_service import DialogueService
from tests.runtime.conftest import copy_tiny_model


@pytest.fixture(scope="module")
def loaded(tiny_model_build: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_flash(copy_tiny_model(tiny_model_build, tmp_path_factory.mktemp("dialogue_tiny")))


def make_service(loaded: Any, **kw: Any) -> DialogueService:
    model, tok, root = loaded
    cons = read_constraints(root)
    words = cons.word_constraint(tok)
    eng = BatchedEngine(model, tok, max_batch=32, words=words)
    solo = BatchedEngine(model, tok, max_batch=1, words=words, use_block_cache=False)
    kw.setdefault("default_deadline_ms", 30_000)
    kw.setdefault("min_mean_logprob", None)  # the tiny model is random: keep its lines
    return DialogueService(eng, fallbacks=FallbackBook.from_json(root / "fallbacks.json"),
                           catalog=tok.catalog, slot_rules=cons.slot_rules, solo_engine=solo, **kw)


def cat(loaded: Any, key: str, i: int = 0) -> str:
    return loaded[1].catalog[key][i]
