"""What the built package carries for its users: a PEP 561 ``py.typed`` marker in every package,
listed in the package data so that wheels and sdists ship it."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("behavior_tree", "runtime", "plugin", "server_sync", "mobile_export")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_is_marked_typed(package: str) -> None:
    assert (ROOT / package / "py.typed").is_file()


def test_the_marker_is_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py.typed" in config["package-data"]["*"]
    included = config["packages"]["find"]["include"]
    assert all(f"{p}*" in included for p in PACKAGES)
