"""Other onnxruntime versions, for exporting and verifying bundles: the game's runtime, not ours.

An ORT-format model is read by the onnxruntime that wrote it and by newer ones, never reliably
by older ones, and the mobile packages games ship (Android AAR, CocoaPods, NuGet) trail the
newest Python wheel. So ``flashnpc export mobile --onnxruntime VERSION`` converts with that
version, and ``flashnpc bundle verify --onnxruntime VERSION`` replays the reference lines
under it.

A version other than the installed one is installed on demand with pip into a private cache
directory (``$FLASHNPC_CACHE_DIR``, else ``$XDG_CACHE_HOME/flashnpc``, else
``~/.cache/flashnpc``; one folder per version, ``onnxruntime/VERSION/site``), never into the
user's environment, and used only by worker processes that put it first on their path
(:func:`run_worker`). ``--no-deps``: numpy, protobuf and flatbuffers come from the environment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runtime.client.bundle import BundleError

# The converter version bundles are written with by default: the oldest onnxruntime that runs
# the INT4 graph and whose ORT files every newer release reads (docs/mobile.md, "Which
# onnxruntime"). Mobile packages published at the time of writing: 1.30-1.31.
DEFAULT_ONNXRUNTIME = "1.27.0"
# The block-wise CPU QMoE kernel the graph needs arrived in 1.24.3.
OLDEST_ONNXRUNTIME = (1, 24, 3)
_VERSION_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
REPO_ROOT = Path(__file__).resolve().parent.parent
INSTALL_TIMEOUT_S = 600


class ToolchainError(BundleError):
    """An onnxruntime version that can't be used: the message says which and why."""


def installed_version() -> str:
    import onnxruntime as ort

    return str(ort.__version__)


def check_version(version: str) -> str:
    """``version`` if it names a release this project can target (``X.Y.Z``, >= 1.24.3)."""
    m = _VERSION_RE.match(version.strip())
    if not m:
        raise ToolchainError(f"--onnxruntime {version!r}: give a release number such as {DEFAULT_ONNXRUNTIME}")
    if tuple(int(g) for g in m.groups()) < OLDEST_ONNXRUNTIME:
        oldest = ".".join(map(str, OLDEST_ONNXRUNTIME))
        raise ToolchainError(f"--onnxruntime {version}: the Flash graph needs onnxruntime >= {oldest} "
                             "(block-wise INT4 QMoE on the CPU)")
    return version.strip()


def cache_dir() -> Path:
    if os.environ.get("FLASHNPC_CACHE_DIR"):
        return Path(os.environ["FLASHNPC_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "flashnpc"


def ensure_onnxruntime(version: str) -> Path | None:
    """The site directory holding onnxruntime ``version``, installed there on first use; None
    when ``version`` is the installed onnxruntime (nothing to add to a worker's path)."""
    version = check_version(version)
    if version == installed_version():
        return None
    home = cache_dir() / "onnxruntime" / version
    site = home / "site"
    if (home / "complete").is_file():
        return site
    home.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="site.tmp-", dir=home))
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
           "--no-compile", "--target", str(staging), f"onnxruntime=={version}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
        if proc.returncode != 0:
            why = (proc.stderr or proc.stdout).strip().splitlines()
            raise ToolchainError(f"onnxruntime {version} could not be installed into {home}: "
                                 f"{why[-1] if why else f'pip exited {proc.returncode}'}")
        if not (staging / "onnxruntime" / "__init__.py").is_file():
            raise ToolchainError(f"onnxruntime {version}: pip installed no onnxruntime package into {home}")
        if site.exists():  # an earlier, interrupted install
            shutil.rmtree(site)
        os.replace(staging, site)
        (home / "complete").write_text(version + "\n")
    except subprocess.TimeoutExpired as exc:
        raise ToolchainError(f"onnxruntime {version}: pip took over {INSTALL_TIMEOUT_S} s") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return site


def worker_env(version: str | None) -> dict[str, str]:
    """The environment of a worker process that runs the repository's code under onnxruntime
    ``version`` (None: the installed one)."""
    env = dict(os.environ)
    paths = [str(REPO_ROOT)]
    site = ensure_onnxruntime(version) if version is not None else None
    if site is not None:
        paths.insert(0, str(site))
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def run_worker(module: str, args: Sequence[str], *, version: str | None, timeout_s: float,
               what: str) -> dict[str, Any]:
    """Run ``python -m module args`` under onnxruntime ``version`` (in the repository's root, so
    path arguments must be absolute) and return the JSON object
    its last line of output holds. A worker that times out, crashes or prints no JSON raises
    :class:`ToolchainError` naming ``what`` it was doing."""
    env = worker_env(version)
    cmd = [sys.executable, "-m", module, *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env,
                              cwd=REPO_ROOT, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ToolchainError(f"{what}: the worker process took over {timeout_s:.0f} s") from exc
    lines = proc.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (proc.stderr or proc.stdout).strip()[-600:]
        raise ToolchainError(f"{what}: the worker process failed (exit {proc.returncode}): {tail}") from None
    if not isinstance(result, dict):
        raise ToolchainError(f"{what}: the worker process printed {lines[-1][:200]!r}, not a JSON object")
    return result


__all__ = ["DEFAULT_ONNXRUNTIME", "ToolchainError", "check_version", "ensure_onnxruntime",
           "installed_version", "run_worker", "worker_env"]
