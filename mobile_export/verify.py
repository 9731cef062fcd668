"""``flashnpc bundle verify PATH``: prove a bundle is sound before it goes into a build.

:func:`verify_bundle` checks, and reports each check:

1. the manifest: schema, format version (a newer one is refused), paths (no absolute path, no
   ``..``), and every listed file's presence, size and SHA-256 (:func:`runtime.client.bundle.open_bundle`);
2. the size budget (8 MB);
3. in a fresh Python process that cannot import torch, onnx or the training code
   (:mod:`mobile_export.verify_worker`): the ORT model loads with onnxruntime and one line per
   archetype and state is generated, whose tokens must equal the Python runtime's for the same
   seed: those recorded in the bundle's ``reference.json`` at export, or, with
   ``reference_dir``, those the runtime generates now from that model directory. With
   ``onnxruntime`` versions, once under each (installed on demand into a private cache, see
   :mod:`mobile_export.toolchain`; ``None`` in the list is the installed onnxruntime).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mobile_export.reference import TIE_TOLERANCE
from mobile_export.toolchain import ToolchainError, run_worker
from runtime.client.bundle import BundleError, open_bundle
from runtime.client.signature import SIGNATURE, PublicKey, key_id, raw_public_key

WORKER_TIMEOUT_S = 600


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class VerifyReport:
    """The checks run on ``path``, in order; ``ok`` only when every one passed."""

    path: Path
    checks: list[Check] = field(default_factory=list)
    worker: dict[str, Any] | None = None  # the last generation worker's result
    workers: list[dict[str, Any]] = field(default_factory=list)  # one per onnxruntime version

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def render(self) -> str:
        lines = [f"bundle {self.path}:"]
        lines += [f"  {'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}" for c in self.checks]
        lines.append("verified: the bundle is sound" if self.ok else "REJECTED")
        return "\n".join(lines)


def verify_bundle(path: str | Path, *, reference_dir: str | Path | None = None,
                  max_bytes: int | None = None, timeout_s: float = WORKER_TIMEOUT_S,
                  onnxruntime: Sequence[str | None] = (None,), public_key: PublicKey | None = None) -> VerifyReport:
    """Run every check on the bundle at ``path`` (directory or zip); never raises for a bad bundle.

    The generation check runs once per entry of ``onnxruntime`` (a version such as ``"1.27.0"``,
    or None for the installed onnxruntime). With ``public_key``, the bundle must carry that
    key's signature of its manifest."""
    from mobile_export.bundle import MAX_BUNDLE_BYTES

    report = VerifyReport(Path(path))
    try:
        bundle = open_bundle(path, public_key=public_key)
    except BundleError as exc:
        report.checks.append(Check("manifest and files", False, str(exc)))
        return report
    if public_key is not None:
        report.checks.append(Check("signature", True, f"{SIGNATURE} is key {key_id(raw_public_key(public_key))}'s "
                                   "Ed25519 signature of manifest.json"))
    m = bundle.manifest
    report.checks.append(Check("manifest", True, f"{m['format']} version {m['format_version']}, model "
                               f"{m['model']['id']} {m['model']['version']}, target {m['model']['target']}, "
                               f"built with onnxruntime {m['onnxruntime'].get('built_with')}"))
    total = sum(e["size"] for e in m["files"]) + (bundle.root / "manifest.json").stat().st_size
    report.checks.append(Check("files", True, f"{len(m['files'])} files, {total} bytes: "
                               "paths, sizes and sha256 match the manifest"))
    budget = max_bytes if max_bytes is not None else MAX_BUNDLE_BYTES
    size = bundle.source.stat().st_size if bundle.extracted else total
    report.checks.append(Check("size", size <= budget, f"{size} bytes "
                               f"{'<=' if size <= budget else '>'} the {budget}-byte budget"))

    with tempfile.TemporaryDirectory(prefix="flashnpc-verify-") as tmp:
        if reference_dir is not None:
            ref_path, source = _fresh_reference(Path(reference_dir), bundle, Path(tmp)), str(reference_dir)
        else:
            ref_path, source = bundle.root / "reference.json", "the reference.json recorded at export"
            if not (ref_path.is_file() and "reference.json" in bundle.files):
                report.checks.append(Check("generation", False, "the bundle lists no reference.json"))
                return report
        for version in dict.fromkeys(onnxruntime):
            report.checks.append(_run_worker(path, ref_path, source, timeout_s, report, version))
    return report


def _fresh_reference(model_dir: Path, bundle: Any, tmp: Path) -> Path:
    """The Python runtime's lines now, from ``model_dir``'s INT4 ONNX model, same settings."""
    from mobile_export.reference import generate_cases
    from runtime.client.onnx_model import FlashOnnx

    recorded = json.loads((bundle.root / "reference.json").read_text(encoding="utf-8"))
    settings = recorded["settings"]
    cases = generate_cases(FlashOnnx.load(model_dir, file=recorded.get("source", "model.int4.onnx")), settings)
    out = tmp / "reference.json"
    out.write_text(json.dumps({"settings": settings, "cases": cases}))
    return out


def _run_worker(path: str | Path, ref_path: Path, source: str, timeout_s: float,
                report: VerifyReport, version: str | None) -> Check:
    name = "generation" if version is None else f"generation under onnxruntime {version}"
    try:
        result = run_worker("mobile_export.verify_worker", [str(Path(path).resolve()), str(ref_path.resolve())],
                            version=version,
                            timeout_s=timeout_s, what="the verifying process")
    except ToolchainError as exc:
        return Check(name, False, str(exc))
    report.worker = result
    report.workers.append(result)
    if result.get("error"):
        return Check(name, False, f"in a fresh process under onnxruntime {result.get('onnxruntime')}: "
                     f"{result['error']}")
    if result.get("forbidden_loaded"):
        return Check(name, False, f"the client-side load imported {result['forbidden_loaded']}")
    if result["mismatches"]:
        shown = "; ".join(result["mismatches"][:5])
        more = len(result["mismatches"]) - 5
        return Check(name, False, f"{len(result['mismatches'])} of {result['cases']} lines differ "
                     f"from {source} under onnxruntime {result['onnxruntime']}: {shown}"
                     + (f"; and {more} more" if more > 0 else ""))
    ties = result.get("near_ties") or []
    parted = (f" ({len(ties)} part from it at a near tie, within {TIE_TOLERANCE} logits: {', '.join(ties[:3])})"
              if ties else "")
    return Check(name, True, f"fresh process (no torch, no training code), onnxruntime "
                 f"{result['onnxruntime']}: {result['cases']} lines (every archetype x state) match "
                 f"{source} token for token{parted}; load {result['load_ms']} ms, generation "
                 f"{result['generate_ms']} ms")


__all__ = ["Check", "VerifyReport", "verify_bundle"]
