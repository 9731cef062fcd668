"""``flashnpc export client --out DIR``: the offline demo client as a PyInstaller one-dir build.

:func:`build_client` exports (or takes) a bundle, verifies it, and runs PyInstaller on
:mod:`mobile_export.client_main` with the bundle added as data (``bundle/`` next to the
executable's libraries) and onnxruntime's shared libraries collected. torch, onnx and the
training/export code are excluded, so the build runs with no Python, torch or project
installed. The build happens in a temporary sibling of ``DIR`` and is renamed into place.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from runtime.client.bundle import open_bundle

NAME = "flashnpc-client"
# never needed by the client; excluding them keeps the build small and fast and proves it
EXCLUDES = ("torch", "torchvision", "onnx", "onnxscript", "matplotlib", "scipy", "pandas", "sympy",
            "IPython", "tkinter", "PIL", "pytest", "hypothesis", "yaml", "tqdm", "rich", "requests",
            "cryptography", "cffi", "_cffi_backend", "onnxruntime_genai",
            "urllib3", "charset_normalizer", "onnxruntime.tools", "onnxruntime.quantization",
            "onnxruntime.transformers", "onnxruntime.training",
            "runtime.factory", "runtime.serving", "runtime.cli",  # the client engine is runtime.client
            "mobile_export.bundle", "mobile_export.client", "mobile_export.verify")
BUILD_TIMEOUT_S = 900


class ClientBuildError(RuntimeError):
    """The client could not be built; the message says why (and what to install, if that is it)."""


@dataclass
class ClientBuild:
    directory: Path    # the one-dir build
    executable: Path   # run this
    size_bytes: int    # everything in ``directory``
    build_s: float


def host_target() -> str:
    """``arm`` on an ARM machine, else ``x86``: the bundle target for a client built here."""
    import platform

    return "arm" if platform.machine().lower() in ("arm64", "aarch64", "armv8l", "armv7l") else "x86"


def build_client(out: str | Path, *, model_dir: str | Path | None = None, bundle: str | Path | None = None,
                 target: str = "x86", force: bool = False) -> ClientBuild:
    """Build the client into ``out`` from ``bundle`` (a directory or zip), or from a bundle
    exported now from ``model_dir`` (default: the shipped model) for ``target``."""
    try:
        import PyInstaller  # noqa: F401
    except ImportError:
        raise ClientBuildError("PyInstaller is not installed: pip install 'flashnpc[build]' "
                               "(pyinstaller>=6)") from None
    dest = Path(out)
    if (dest.exists() or dest.is_symlink()) and not force:
        raise ClientBuildError(f"{dest} already exists; pass --force (force=True) to replace it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        if bundle is None:
            from mobile_export.bundle import export_bundle
            from runtime.paths import DEFAULT_MODEL_DIR

            bundle = export_bundle(model_dir if model_dir is not None else DEFAULT_MODEL_DIR,
                                   staging / "bundle", target=target).path
        data = open_bundle(bundle).root  # verified; a zip's extracted directory
        _pyinstaller(data, staging)
        built = staging / "dist" / NAME
        if dest.exists() or dest.is_symlink():
            os.replace(dest, staging / "previous")
        os.replace(built, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    exe = dest / (NAME + (".exe" if os.name == "nt" else ""))
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file() and not p.is_symlink())
    return ClientBuild(dest, exe, size, time.perf_counter() - t0)


def _pyinstaller(bundle_dir: Path, staging: Path) -> None:
    repo = Path(__file__).resolve().parent.parent
    script = repo / "mobile_export" / "client_main.py"
    cmd = [sys.executable, "-m", "PyInstaller", "--noconfirm", "--onedir", "--name", NAME,
           "--log-level", "WARN", "--distpath", str(staging / "dist"),
           "--workpath", str(staging / "work"), "--specpath", str(staging / "spec"),
           "--paths", str(repo), "--add-data", f"{bundle_dir}{os.pathsep}bundle",
           "--collect-binaries", "onnxruntime"]
    for module in EXCLUDES:
        cmd += ["--exclude-module", module]
    cmd.append(str(script))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise ClientBuildError(f"PyInstaller took over {BUILD_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        raise ClientBuildError(f"PyInstaller failed (exit {proc.returncode}): "
                               f"{(proc.stderr or proc.stdout).strip()[-1500:]}")


__all__ = ["EXCLUDES", "ClientBuild", "ClientBuildError", "build_client", "host_target"]
