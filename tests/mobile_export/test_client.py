"""The packaged offline client: a PyInstaller one-dir build that runs with an empty environment."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mobile_export.client import ClientBuildError, build_client


def test_client_main_prints_lines_from_a_bundle(bundle_zip):
    out = subprocess.run([sys.executable, "-m", "mobile_export.client_main", "demo", "--bundle",
                          str(bundle_zip.path), "--lines", "3"], capture_output=True, text=True,
                         check=True)
    lines = out.stdout.splitlines()
    assert lines[0].startswith("model flash sha256:") and lines[1].startswith("first line after")
    assert len(lines) == 5 and all(" / " in line for line in lines[2:])


def test_an_existing_client_directory_is_refused(tmp_path, bundle_dir):
    pytest.importorskip("PyInstaller")
    (tmp_path / "client").mkdir()
    with pytest.raises(ClientBuildError, match="already exists; pass --force"):
        build_client(tmp_path / "client", bundle=bundle_dir.path)


@pytest.mark.slow
def test_packaged_client_runs_with_an_empty_environment(bundle_dir, tmp_path):
    pytest.importorskip("PyInstaller", reason="the build extra: pip install 'flashnpc[build]'")
    built = build_client(tmp_path / "client", bundle=bundle_dir.path)
    assert built.executable.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["client"]  # no temporary left behind
    packaged = {p.name for p in built.directory.rglob("*")}
    assert not {"torch", "onnx"} & packaged  # neither torch nor onnx was collected
    # no PYTHONPATH, no site-packages, no HOME: only what the build carries
    run = subprocess.run([str(built.executable), "demo", "--lines", "4"], env={}, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[1].startswith("first line after")
    assert len(lines) == 6 and all(" / " in line and len(line.split(" / ", 1)[1]) > 10 for line in lines[2:])
