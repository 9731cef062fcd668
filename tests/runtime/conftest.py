"""Shared runtime fixtures: a tiny exported Flash model directory (nothing trained, fixed seed).

``tiny_model_dir`` is what ``flashnpc export`` writes (model.onnx, model.int4.onnx,
tokenizer.json, config.json, catalog.json, fallbacks.json) for a random tiny model with a
tokenizer trained on a slice of the default line book. Its lines are garbage, which is exactly
what exercises fallbacks and the banned-token masks.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.runtime.factory.test_export_fixtures import tiny_config, tiny_model


def build_tiny_model_dir(root: Path, *, seed: int = 0, vocab_size: int = 512, block_size: int = 64,
                         bigrams: bool = False, trigrams: bool = False) -> Path:
    """Export a seeded random tiny model with a line-book tokenizer to ``root/flash``. Without
    the book's word bigrams and trigrams by default: a random model under them falls back on
    nearly every line, and these models test the engine's mechanics (tests/runtime/client/test_bigrams*.py
    and test_trigrams.py test them on the shipped model)."""
    import torch

    from runtime.factory.export import export_checkpoint, write_constraints
    from runtime.factory.linebook import load_line_book
    from runtime.tokenizer import train_tokenizer

    book = load_line_book()
    catalog = book.catalog()
    texts = [e.text for e in book.examples()[::97]]
    tok = train_tokenizer(texts, catalog, vocab_size=vocab_size)
    model = tiny_model(tiny_config(vocab_size=tok.vocab_size, block_size=block_size), seed=seed)
    ckpt = root / "ckpt"
    ckpt.mkdir(parents=True)
    torch.save({"config": asdict(model.config), "model": model.state_dict(), "step": 1}, ckpt / "model.pt")
    (ckpt / "config.json").write_text(json.dumps(asdict(model.config)))
    (ckpt / "catalog.json").write_text(json.dumps(catalog))
    tok.save(ckpt / "tokenizer.json")
    write_constraints(ckpt / "constraints.json", bigrams=bigrams, trigrams=trigrams)  # the export copies it
    export_checkpoint(ckpt, root / "flash")
    return root / "flash"


def copy_tiny_model(build: Path, root: Path) -> Path:
    """A copy of the session's tiny model build (``tiny_model_build``, tests/conftest.py) under
    ``root``, its checkpoint beside it as ``build_tiny_model_dir(root)`` writes them; returns
    ``root/flash``. Each copy is its own, so a test writing into its model directory touches no
    other."""
    shutil.copytree(build.parent, root, dirs_exist_ok=True)
    return root / "flash"


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model_build: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_tiny_model(tiny_model_build, tmp_path_factory.mktemp("tiny_flash"))


@pytest.fixture(scope="session")
def shipped_fast_report() -> dict:
    """``evaluate(cfg=EvalConfig.fast())`` on the shipped model, run once for every test that reads it."""
    from runtime.factory.evaluate import EvalConfig, evaluate

    return evaluate(cfg=EvalConfig.fast())


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models: one thread is as fast, and spinning worker threads crawl on a busy shared CPU."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
