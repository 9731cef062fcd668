"""Bundles for the onnxruntime a game ships: conversion and replay under another version.

These install onnxruntime 1.27.0 (the default converter) with pip into the private cache on
first use, from the package index this machine is configured with.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mobile_export.bundle import export_bundle
from mobile_export.toolchain import (
    DEFAULT_ONNXRUNTIME,
    ToolchainError,
    check_version,
    ensure_onnxruntime,
    installed_version,
)
from mobile_export.verify import verify_bundle
from plugin.cli import main


def test_the_default_export_is_written_by_the_oldest_targeted_onnxruntime(bundle_dir):
    ort_info = bundle_dir.manifest["onnxruntime"]
    assert ort_info["built_with"] == ort_info["min_onnxruntime"] == DEFAULT_ONNXRUNTIME
    assert set(ort_info["tested_with"]) == {DEFAULT_ONNXRUNTIME, installed_version()}
    header = (bundle_dir.path / "required_operators.config").read_text().splitlines()[0]
    assert f"onnxruntime {DEFAULT_ONNXRUNTIME}" in header


def test_a_bundle_verifies_under_the_version_that_wrote_it_and_the_installed_one(bundle_dir):
    report = verify_bundle(bundle_dir.path, onnxruntime=[None, DEFAULT_ONNXRUNTIME])
    assert report.ok, report.render()
    assert [w["onnxruntime"] for w in report.workers] == [installed_version(), DEFAULT_ONNXRUNTIME]
    assert "generation under onnxruntime 1.27.0" in report.render()


def test_an_ort_file_from_the_newest_onnxruntime_fails_on_the_older_one_with_the_reason(model_dir, tmp_path):
    done = export_bundle(model_dir, tmp_path / "new", onnxruntime=installed_version())
    assert done.manifest["onnxruntime"]["tested_with"] == [installed_version()]
    report = verify_bundle(done.path, onnxruntime=[DEFAULT_ONNXRUNTIME])
    assert not report.ok
    failed = next(c for c in report.checks if not c.ok)
    assert failed.name == f"generation under onnxruntime {DEFAULT_ONNXRUNTIME}"
    assert "onnxruntime 1.27.0" in failed.detail and "Error" in failed.detail


def test_the_cached_onnxruntime_is_private_to_worker_processes():
    site = ensure_onnxruntime(DEFAULT_ONNXRUNTIME)
    assert site is not None and (site / "onnxruntime" / "__init__.py").is_file()
    assert site not in map(Path, sys.path)  # never on this process's path
    assert ensure_onnxruntime(installed_version()) is None  # the installed one needs no install


@pytest.mark.parametrize("version, message", [
    ("latest", r"give a release number such as 1\.27\.0"),
    ("1.27.0; rm -rf /", r"give a release number"),
    ("1.23.2", r"needs onnxruntime >= 1\.24\.3"),
])
def test_an_unusable_onnxruntime_version_is_refused_by_name(version, message):
    with pytest.raises(ToolchainError, match=message):
        check_version(version)


def test_a_version_pip_cannot_find_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHNPC_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ToolchainError, match=r"onnxruntime 1\.99\.0 could not be installed into"):
        ensure_onnxruntime("1.99.0")
    assert not any((tmp_path / "cache").rglob("site"))  # nothing half-installed is kept


def test_export_mobile_and_bundle_verify_take_an_onnxruntime_version(model_dir, tmp_path, capsys):
    out = tmp_path / "b"
    assert main(["export", "mobile", "--model", str(model_dir), "--out", str(out),
                 "--onnxruntime", DEFAULT_ONNXRUNTIME]) == 0
    assert json.loads((out / "manifest.json").read_text())["onnxruntime"]["built_with"] == DEFAULT_ONNXRUNTIME
    capsys.readouterr()
    assert main(["bundle", "verify", str(out), "--onnxruntime", DEFAULT_ONNXRUNTIME, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [w["onnxruntime"] for w in report["workers"]] == [installed_version(), DEFAULT_ONNXRUNTIME]
    assert main(["bundle", "verify", str(out), "--onnxruntime", "nightly"]) == 2
    assert "give a release number" in capsys.readouterr().err


def test_export_and_verify_take_paths_relative_to_the_callers_directory(model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["export", "mobile", "--model", str(model_dir), "--out", "build/bundle", "--zip"]) == 0
    assert (tmp_path / "build" / "bundle.zip").is_file()
    capsys.readouterr()
    assert main(["bundle", "verify", "build/bundle.zip", "--onnxruntime", DEFAULT_ONNXRUNTIME]) == 0
