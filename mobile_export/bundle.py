"""Build a model bundle for mobile and desktop builds: ``flashnpc export mobile``.

:func:`export_bundle` turns an exported model directory (``flashnpc export`` output; default
the shipped ``runtime/assets/flash/``) into a bundle (see :mod:`runtime.client.bundle` and
``docs/mobile.md``):

    manifest.json               format version, model id/version, files with size and sha256,
                                tokenizer and prompt layout, tensor names and shapes, KV layout,
                                onnxruntime version, operator list
    model.ort                   the INT4 model in ORT format, optimisations fixed for the target
    required_operators.config   the operators a reduced/minimal onnxruntime build must include
    tokenizer.json config.json catalog.json fallbacks.json constraints.json
    authored.json               a fine-tune's studio lines, played back where they cover a request
                                (only when the model directory has one)
    reference.json              one seeded line per archetype and state, as the Python runtime
                                generated it (``flashnpc bundle verify`` regenerates and compares)

Everything is written into a temporary sibling of the destination and renamed into place at
the end, so a failure leaves nothing half-written; an existing destination is refused unless
``force``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mobile_export.toolchain import (
    DEFAULT_ONNXRUNTIME,
    check_version,
    installed_version,
    run_worker,
)
from runtime.client.bundle import BUNDLE_FORMAT, BUNDLE_VERSION, MANIFEST, BundleError, sha256_file

TARGETS = {"arm": "arm", "x86": "amd64"}  # --target -> the converter's target_platform
MAX_BUNDLE_BYTES = 8_000_000
MODEL_FILE = "model.ort"
OPERATORS_FILE = "required_operators.config"
SOURCE_MODEL = "model.int4.onnx"
WORKER_TIMEOUT_S = 600


class BundleExportError(BundleError):
    """An export that cannot be done: the message says which input or option is wrong."""


@dataclass
class ExportedBundle:
    """What :func:`export_bundle` wrote: ``path`` (directory or zip), per-file sizes, totals."""

    path: Path
    manifest: dict[str, Any]
    total_bytes: int      # the bundle's files, manifest included
    zip_bytes: int | None  # the archive's size when written as a zip


def export_bundle(model_dir: str | Path, out: str | Path, *, target: str = "arm",
                  zip_output: bool = False, force: bool = False, model_id: str | None = None,
                  max_bytes: int = MAX_BUNDLE_BYTES, onnxruntime: str = DEFAULT_ONNXRUNTIME,
                  genai: bool = False) -> ExportedBundle:
    """Write the bundle of ``model_dir`` to ``out`` (a directory, or with ``zip_output`` a zip
    file: ``.zip`` is appended to ``out`` when missing). ``target``: ``arm`` (phones, Apple
    silicon) or ``x86`` (x86-64 desktops). ``onnxruntime``: the version that writes
    ``model.ort`` (installed on demand into a private cache, :mod:`mobile_export.toolchain`);
    the game's onnxruntime must be that version or newer. ``genai``: the model goes to
    ``genai/model.ort`` beside an onnxruntime-genai folder's files (:mod:`mobile_export.genai`),
    so one copy serves both routes. The bundle's reference lines are
    replayed under that version and under the installed one before anything is written.
    Raises :class:`BundleExportError`.
    """
    if target not in TARGETS:
        raise BundleExportError(f"unknown target {target!r}; known: {', '.join(TARGETS)}")
    built_with = check_version(onnxruntime)
    src = Path(model_dir)
    for name in (SOURCE_MODEL, "config.json", "tokenizer.json"):
        if not (src / name).is_file():
            raise BundleExportError(f"{src / name}: missing (a model directory from `flashnpc export` "
                                    "is needed)")
    dest = Path(out)
    if zip_output and dest.suffix != ".zip":
        dest = dest.with_name(dest.name + ".zip")
    if (dest.exists() or dest.is_symlink()) and not force:
        raise BundleExportError(f"{dest} already exists; pass --force (force=True) to replace it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        stage = staging / "bundle"
        stage.mkdir()
        manifest = _build(src, stage, staging / "work", target, model_id or src.resolve().name, built_with, genai)
        if built_with != installed_version():
            _replay(stage, built_with)
        total = sum(p.stat().st_size for p in stage.rglob("*") if p.is_file())
        zip_bytes = None
        if zip_output:
            archive = staging / "bundle.zip"
            _write_zip(stage, archive, manifest)
            zip_bytes = archive.stat().st_size
            final = archive
        else:
            final = stage
        size = zip_bytes if zip_bytes is not None else total
        if size > max_bytes:
            raise BundleExportError(f"the bundle would be {size} bytes, over the {max_bytes}-byte "
                                    f"budget ({manifest['model']['file']} is "
                                    f"{(stage / manifest['model']['file']).stat().st_size} bytes)")
        _move_into_place(final, dest, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ExportedBundle(dest, manifest, total, zip_bytes)


def _build(src: Path, stage: Path, work: Path, target: str, model_id: str,
           built_with: str, genai: bool) -> dict[str, Any]:
    from mobile_export.reference import compare_cases, generate_cases, reference_settings
    from runtime.client.onnx_model import FlashOnnx

    operators = _convert(src / SOURCE_MODEL, work, stage, target, built_with)
    for name in ("tokenizer.json", "config.json"):
        shutil.copyfile(src / name, stage / name)
    tokenizer_data = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    if (src / "catalog.json").is_file():
        shutil.copyfile(src / "catalog.json", stage / "catalog.json")
    else:
        _write_json(stage / "catalog.json", tokenizer_data["catalog"])
    _copy_or_write(src, stage / "fallbacks.json")
    _copy_or_write(src, stage / "constraints.json")
    if (src / "authored.json").is_file():  # a fine-tune's studio lines, played back (runtime.client.authored)
        shutil.copyfile(src / "authored.json", stage / "authored.json")

    # the Python runtime on the source model is the reference the ORT model must reproduce
    settings = reference_settings()
    source = FlashOnnx.load(src, file=SOURCE_MODEL)
    expected = generate_cases(source, settings)
    (stage / "reference.json").write_text(json.dumps(
        {"settings": settings, "source": SOURCE_MODEL, "cases": expected}, ensure_ascii=False) + "\n")
    bundled = FlashOnnx.open_files(stage, MODEL_FILE, _ort_options())
    mismatches = compare_cases(expected, generate_cases(bundled, settings), model=bundled)
    if mismatches:
        raise BundleExportError(f"the ORT model for target {target}, written by onnxruntime {built_with}, "
                                f"does not reproduce the Python runtime's tokens under onnxruntime "
                                f"{installed_version()}: {'; '.join(mismatches[:5])}")
    model_file = MODEL_FILE
    if genai:
        from mobile_export.genai import BUNDLE_SUBDIR, write_genai_files

        write_genai_files(src, stage / BUNDLE_SUBDIR, model_file=stage / MODEL_FILE, side_files=False)
        (stage / MODEL_FILE).unlink()
        model_file = f"{BUNDLE_SUBDIR}/{MODEL_FILE}"

    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    tok = source.tokenizer
    assert tok is not None
    n_layer, n_head = int(config["n_layer"]), int(config["n_head"])
    manifest: dict[str, Any] = {
        "format": BUNDLE_FORMAT,
        "format_version": BUNDLE_VERSION,
        "model": {
            "id": model_id,
            "version": "sha256:" + sha256_file(src / SOURCE_MODEL)[:16],
            "file": model_file,
            "format": "ort",
            "target": target,
            "optimization": {"style": "Fixed", "level": "all", "target_platform": TARGETS[target]},
            "source": SOURCE_MODEL,
            "config": config,
        },
        "created_at": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z"),
        "files": [],
        "vocab_size": tok.vocab_size,
        "tokenizer": {
            "file": "tokenizer.json", "format": tokenizer_data.get("format"),
            "version": tokenizer_data.get("version"), "n_control": tok.n_control,
            "byte_offset": tok.byte_offset, "pad_id": tok.pad_id, "bos_id": tok.bos_id,
            "eos_id": tok.eos_id, "line_id": tok.line_id,
            "slot_ids": {s: tok.id_of(f"<slot:{s}>") for s in tok.catalog["slots"]},
            "controls": list(tok.controls), "spec": "docs/mobile.md#tokenizer (and docs/tokenizer.md)",
        },
        "prompt": {
            "layout": "<bos> <arch:A> <persona:P>... <state:S> <intent:I> <ctx:slot=value>... <line>",
            "persona_order": "sorted by name, duplicates dropped",
            "context_order": "catalog slot order; slots may be omitted",
            "prefix_len": "3 + number of persona traits (bos, arch, persona..., state): cacheable",
            "stop": "<eos>", "max_positions": int(config["block_size"]),
            "slot_markers": "a slot token in the output decodes to {player}, {location}, {item}",
        },
        "inputs": _tensors(bundled.session.get_inputs()),
        "outputs": _tensors(bundled.session.get_outputs()),
        "kv_cache": {
            "n_layer": n_layer, "n_head": n_head, "head_dim": int(config["n_embd"]) // n_head,
            "dtype": "float32", "layout": "[batch, n_head, past_len, head_dim]",
            "inputs": [f"past_{k}_{i}" for i in range(n_layer) for k in ("key", "value")],
            "outputs": [f"present_{k}_{i}" for i in range(n_layer) for k in ("key", "value")],
            "first_step": "past tensors of shape [batch, n_head, 0, head_dim]",
            "next_step": "present_* of this step is past_* of the next (length past_len + new)",
        },
        "sampling": _engine_sampling_defaults(),
        "onnxruntime": {
            "built_with": built_with, "min_onnxruntime": built_with,
            "tested_with": sorted({built_with, installed_version()}, key=_version_key),
            "session_options": {"session.load_model_format": "ORT",
                                "graph_optimization_level": "ORT_DISABLE_ALL (already applied)",
                                "intra_op_num_threads": 1, "session.intra_op.allow_spinning": "0"},
            "required_operators_config": OPERATORS_FILE,
        },
        "operators": operators,
        "reference": {"file": "reference.json", "cases": len(expected), **settings},
    }
    for path in sorted(p for p in stage.rglob("*") if p.is_file()):
        manifest["files"].append({"path": path.relative_to(stage).as_posix(), "size": path.stat().st_size,
                                  "sha256": sha256_file(path)})
    _write_json(stage / MANIFEST, manifest)
    return manifest


def _engine_sampling_defaults() -> dict[str, Any]:
    """The Python engine's defaults (LineGenerator), so a port samples the way the game's
    Python build does."""
    import inspect

    from runtime.client.generator import LineGenerator

    init = inspect.signature(LineGenerator.__init__).parameters
    gen = inspect.signature(LineGenerator.generate).parameters
    return {"temperature": init["temperature"].default, "top_p": init["top_p"].default,
            "top_k": init["top_k"].default, "max_tokens": gen["max_tokens"].default}


def _ort_options() -> Any:
    from runtime.client.onnx_model import ort_session_options

    return ort_session_options(1)


def _convert(model: Path, work: Path, stage: Path, target: str, version: str) -> list[str]:
    """ORT-format conversion with onnxruntime ``version``'s own tool, in a worker process
    (:mod:`mobile_export.convert_worker`); returns the operator list."""
    out = work / "ort"
    out.mkdir(parents=True)
    result = run_worker("mobile_export.convert_worker", [str(model.resolve()), str(out.resolve()), TARGETS[target]],
                        version=version, timeout_s=WORKER_TIMEOUT_S, what=f"converting {model} to ORT format")
    if "error" in result:
        raise BundleExportError(f"{model}: onnxruntime {result.get('onnxruntime', version)} could not "
                                f"convert it to ORT format ({result['error']})")
    if result.get("onnxruntime") != version:
        raise BundleExportError(f"converting {model}: asked for onnxruntime {version}, the worker ran "
                                f"{result.get('onnxruntime')}")
    shutil.copyfile(out / "model.ort", stage / MODEL_FILE)
    entries = [str(e) for e in result["entries"]]
    # the tool's header names our temporary paths; write a stable one instead
    (stage / OPERATORS_FILE).write_text(
        f"# operators model.ort needs (written by onnxruntime {version}, target {target}); pass to an\n"
        "# onnxruntime reduced/minimal build: --include_ops_by_config required_operators.config\n"
        + "\n".join(entries) + "\n")
    operators = []
    for entry in entries:
        domain, opset, ops = entry.split(";")
        operators += [f"{domain};{opset};{op}" for op in ops.split(",")]
    return operators


def _replay(stage: Path, version: str) -> None:
    """The staged bundle's reference lines, regenerated under onnxruntime ``version`` in a
    fresh process, must match token for token."""
    result = run_worker("mobile_export.verify_worker", [str(stage.resolve()), str((stage / "reference.json").resolve())],
                        version=version, timeout_s=WORKER_TIMEOUT_S,
                        what=f"replaying the reference lines under onnxruntime {version}")
    if result.get("error") or result.get("mismatches"):
        why = result.get("error") or "; ".join(result["mismatches"][:5])
        raise BundleExportError(f"the bundle's ORT model does not reproduce the Python runtime's tokens "
                                f"under onnxruntime {version}: {why}")


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def _tensors(args: list[Any]) -> list[dict[str, Any]]:
    return [{"name": a.name, "dtype": a.type.removeprefix("tensor(").removesuffix(")"),
             "shape": [d if d is not None else "?" for d in a.shape]} for a in args]


def _copy_or_write(src: Path, dest: Path) -> None:
    """Copy a side file (fallbacks.json, constraints.json) from the model directory, or write
    it from the default line book as `flashnpc export` does when the directory predates it."""
    from runtime.factory.export import write_constraints, write_fallbacks

    if (src / dest.name).is_file():
        shutil.copyfile(src / dest.name, dest)
    else:
        {"fallbacks.json": write_fallbacks, "constraints.json": write_constraints}[dest.name](dest)


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_zip(stage: Path, archive: Path, manifest: dict[str, Any]) -> None:
    """Files at the archive root; fixed timestamps so the same bundle zips to the same bytes."""
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name in [MANIFEST, *(e["path"] for e in manifest["files"])]:
            zf.writestr(zip_entry(name), (stage / name).read_bytes())


def zip_entry(name: str) -> zipfile.ZipInfo:
    """A bundle's zip entry: deflated, mode 0644, a fixed timestamp (same files, same bytes)."""
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    return info


def _move_into_place(final: Path, dest: Path, staging: Path) -> None:
    """Rename ``final`` onto ``dest``; an existing ``dest`` (``force``) is moved aside first and
    deleted only after the new one is in place."""
    old = None
    if dest.exists() or dest.is_symlink():
        old = staging / "previous"
        os.replace(dest, old)
    try:
        os.replace(final, dest)
    except OSError:
        if old is not None:
            os.replace(old, dest)
        raise


__all__ = ["MAX_BUNDLE_BYTES", "TARGETS", "BundleExportError", "ExportedBundle", "export_bundle", "zip_entry"]
