"""Suite-wide settings and the setups many directories share.

OpenMP threads that spin while waiting make torch 2-10x slower on a shared 2-core machine, so
they must be told to sleep before torch is first imported.

The default line book is loaded and expanded once a session: ``load_line_book()`` (and
``load_line_book(<the default book's directory>)``) returns one shared :class:`LineBook` while
the book's YAML files read the same, byte for byte, as when it was loaded. Expanding the book
takes seconds to tens of seconds, and the tiny test models, the evaluation, ``flashnpc train``,
the tokenizer and the writer tests all read it. A :class:`LineBook` is not changed by its
readers (its examples are frozen, its accessors return copies). The line book's own tests
(``test_linebook*.py``) load it afresh every time, since loading it is what they test.

``tiny_model_build`` is the tiny random exported model of ``tests/runtime/conftest.py``, built
once a session; each directory that used to build its own gets a copy of it
(``copy_tiny_model`` of tests/runtime/conftest.py), so a test that writes into its model directory still touches no other.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import runtime.factory.linebook as _linebook  # imports no torch

_fresh_load_line_book = _linebook.load_line_book
_shared_books: dict[str, Any] = {}
_share_books = True


def _book_digest(root: Path) -> str:
    """The book directory's YAML files, names and bytes, as one digest."""
    digest = hashlib.sha256()
    for file in sorted(p for p in root.iterdir() if p.suffix in (".yaml", ".yml")):
        digest.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()


def shared_load_line_book(path: str | Path | None = None) -> Any:
    """``load_line_book(path)``, with the default book loaded once per content (see the module
    docstring); any other path, or the line book's own tests, load afresh."""
    root = Path(path) if path is not None else Path(_linebook.DEFAULT_PATH)
    default = Path(_linebook.DEFAULT_PATH)
    if not _share_books or not root.is_dir() or not default.is_dir() or root.resolve() != default.resolve():
        return _fresh_load_line_book(path)
    key = _book_digest(root)
    if key not in _shared_books:
        _shared_books[key] = _fresh_load_line_book(path)
    return _shared_books[key]


# before any test module is imported, so that `from runtime.factory.linebook import
# load_line_book` binds the shared loader too; once, should this file be imported twice
if _linebook.load_line_book.__name__ != "shared_load_line_book":
    _linebook.load_line_book = shared_load_line_book


@pytest.fixture(scope="module", autouse=True)
def _line_book_tests_load_afresh(request: pytest.FixtureRequest) -> Iterator[None]:
    global _share_books
    own = Path(str(request.node.path)).name.startswith("test_linebook")
    _share_books = not own
    yield
    _share_books = True


@pytest.fixture(scope="session")
def tiny_model_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random exported model (``build_tiny_model_dir``), built once: hand out copies
    (``copy_tiny_model``), never this directory."""
    from tests.runtime.conftest import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny_flash_build"))
