"""Bundles of the tiny random runtime model (tests/runtime/conftest.py), exported once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from mobile_export.bundle import ExportedBundle, export_bundle
from tests.runtime.conftest import copy_tiny_model


@pytest.fixture(scope="session")
def model_dir(tiny_model_build: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_tiny_model(tiny_model_build, tmp_path_factory.mktemp("mobile_model"))


@pytest.fixture(scope="session")
def bundle_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ExportedBundle:
    return export_bundle(model_dir, tmp_path_factory.mktemp("bundles") / "flash", target="arm")


@pytest.fixture(scope="session")
def bundle_zip(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ExportedBundle:
    return export_bundle(model_dir, tmp_path_factory.mktemp("bundles") / "flash", target="x86",
                         zip_output=True)
