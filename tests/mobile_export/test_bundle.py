"""Model bundles: export, verify, tampering, loading through the runtime, bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from mobile_export.bundle import BundleExportError, ExportedBundle, export_bundle
from mobile_export.toolchain import DEFAULT_ONNXRUNTIME
from mobile_export.verify import verify_bundle
from plugin.cli import main
from runtime.client.bundle import BUNDLE_VERSION, BundleError, open_bundle, sha256_file
from runtime.client.onnx_model import FlashOnnx
from runtime.paths import DEFAULT_MODEL_DIR


def copy_of(bundle: ExportedBundle, tmp_path: Path) -> Path:
    dest = tmp_path / "copy"
    shutil.copytree(bundle.path, dest)
    return dest


def edit_manifest(root: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = root / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def rehash(root: Path, name: str) -> None:
    """Make the manifest agree with a file changed on purpose (to reach the later checks)."""
    def change(m: dict[str, Any]) -> None:
        entry = next(e for e in m["files"] if e["path"] == name)
        entry["size"] = (root / name).stat().st_size
        entry["sha256"] = sha256_file(root / name)
    edit_manifest(root, change)


def failed_check(path: Path) -> str:
    report = verify_bundle(path)
    assert not report.ok
    return next(c.detail for c in report.checks if not c.ok)


# ------------------------------------------------------------------ export then verify


def test_export_mobile_then_bundle_verify_passes(model_dir, tmp_path, capsys):
    out = tmp_path / "bundle"
    assert main(["export", "mobile", "--model", str(model_dir), "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["bundle", "verify", str(out)]) == 0
    report = capsys.readouterr().out
    assert "verified: the bundle is sound" in report
    assert "80 lines (every archetype x state) match" in report


def test_zip_bundle_verifies_against_the_live_python_runtime(bundle_zip, model_dir, capsys):
    assert bundle_zip.path.suffix == ".zip" and zipfile.is_zipfile(bundle_zip.path)
    assert main(["bundle", "verify", str(bundle_zip.path), "--reference", str(model_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["worker"]["forbidden_loaded"] == []
    assert report["worker"]["cases"] == 80


def test_manifest_describes_files_tensors_tokenizer_and_operators(bundle_dir, model_dir):
    m = bundle_dir.manifest
    root = bundle_dir.path
    assert json.loads((root / "manifest.json").read_text()) == m
    assert m["format_version"] == BUNDLE_VERSION and m["model"]["target"] == "arm"
    for entry in m["files"]:
        assert (root / entry["path"]).stat().st_size == entry["size"]
        assert sha256_file(root / entry["path"]) == entry["sha256"]
    assert {e["path"] for e in m["files"]} >= {"model.ort", "required_operators.config", "tokenizer.json",
                                                 "fallbacks.json", "reference.json"}
    config = json.loads((model_dir / "config.json").read_text())
    inputs = {t["name"]: t for t in m["inputs"]}
    assert inputs["input_ids"]["dtype"] == "int64"
    head_dim = config["n_embd"] // config["n_head"]
    assert inputs["past_key_0"]["shape"][1:] == [config["n_head"], "past", head_dim]
    assert m["kv_cache"]["inputs"][:2] == ["past_key_0", "past_value_0"]
    assert {t["name"] for t in m["outputs"]} >= {"logits", "present_key_0", "router_probs"}
    assert m["vocab_size"] == config["vocab_size"]
    assert m["tokenizer"]["controls"][:4] == ["<pad>", "<bos>", "<eos>", "<line>"]
    assert "com.microsoft;1;MatMulNBits" in m["operators"]
    assert m["onnxruntime"]["built_with"] == DEFAULT_ONNXRUNTIME and ort.__version__ in m["onnxruntime"]["tested_with"]
    import inspect

    from runtime.client.generator import LineGenerator
    engine = inspect.signature(LineGenerator.__init__).parameters
    assert {k: m["sampling"][k] for k in ("temperature", "top_p", "top_k")} == \
        {k: engine[k].default for k in ("temperature", "top_p", "top_k")}
    config_lines = (root / "required_operators.config").read_text().splitlines()
    assert any(line.startswith("com.microsoft;1;") and "QMoE" in line for line in config_lines)
    assert not any(str(root.parent) in line for line in config_lines)  # no build paths leak


# ------------------------------------------------------------------ tampering


def test_a_changed_byte_is_rejected_naming_the_file(bundle_dir, tmp_path):
    root = copy_of(bundle_dir, tmp_path)
    data = bytearray((root / "model.ort").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (root / "model.ort").write_bytes(bytes(data))
    assert "model.ort: sha256 differs from the manifest (file altered)" in failed_check(root)
    with pytest.raises(BundleError, match=r"model\.ort: sha256 differs"):
        FlashOnnx.load(root)


def test_a_truncated_file_is_rejected_naming_the_file(bundle_dir, tmp_path):
    root = copy_of(bundle_dir, tmp_path)
    text = (root / "tokenizer.json").read_bytes()
    (root / "tokenizer.json").write_bytes(text[:-10])
    assert f"tokenizer.json: {len(text) - 10} bytes, the manifest says {len(text)} (truncated)" \
        in failed_check(root)


def test_a_missing_file_is_rejected_naming_the_file(bundle_dir, tmp_path):
    root = copy_of(bundle_dir, tmp_path)
    (root / "fallbacks.json").unlink()
    assert "fallbacks.json: missing" in failed_check(root)


@pytest.mark.parametrize(("path", "message"), [
    ("../model.ort", "contains '..'"),
    ("sub/../../x", "contains '..'"),
    ("/etc/passwd", "is an absolute path"),
    ("C:/Windows/x", "is an absolute path"),
    ("a\\b", "backslash"),
])
def test_path_traversal_in_the_manifest_is_rejected(bundle_dir, tmp_path, path, message):
    root = copy_of(bundle_dir, tmp_path)
    edit_manifest(root, lambda m: m["files"].append({"path": path, "size": 1, "sha256": "0" * 64}))
    assert message in failed_check(root)


def test_a_newer_format_version_is_refused(bundle_dir, tmp_path):
    root = copy_of(bundle_dir, tmp_path)
    edit_manifest(root, lambda m: m.update(format_version=BUNDLE_VERSION + 1))
    detail = failed_check(root)
    assert f"bundle format version {BUNDLE_VERSION + 1} is newer than this runtime reads" in detail
    with pytest.raises(BundleError, match="newer than this runtime reads"):
        FlashOnnx.load(root)


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m.pop("operators"), "missing key 'operators'"),
    (lambda m: m.update(format="something-else"), "format is 'something-else'"),
    (lambda m: m["files"][0].update(sha256="xyz"), "sha256 must be 64 lower-case hex digits"),
    (lambda m: m["files"].append(dict(m["files"][0])), "is listed twice"),
])
def test_a_manifest_that_breaks_the_schema_is_rejected(bundle_dir, tmp_path, change, message):
    root = copy_of(bundle_dir, tmp_path)
    edit_manifest(root, change)
    assert message in failed_check(root)


def test_generation_that_differs_from_the_reference_fails_verify(bundle_dir, tmp_path):
    root = copy_of(bundle_dir, tmp_path)
    ref = json.loads((root / "reference.json").read_text())
    ref["cases"][3]["ids"] = [*ref["cases"][3]["ids"], 5]
    (root / "reference.json").write_text(json.dumps(ref))
    rehash(root, "reference.json")
    detail = failed_check(root)
    case = ref["cases"][3]
    assert "1 of 80 lines differ" in detail and f"{case['archetype']}/{case['state']}" in detail


def test_a_corrupt_zip_is_a_clear_error(bundle_zip, tmp_path):
    broken = tmp_path / "broken.zip"
    broken.write_bytes(bundle_zip.path.read_bytes()[: bundle_zip.zip_bytes // 2])
    with pytest.raises(BundleError, match="not a readable zip bundle"):
        open_bundle(broken)
    assert "not a readable zip bundle" in failed_check(broken)


# ------------------------------------------------------------------ loading through the runtime


def test_bundle_generation_equals_model_directory_generation(bundle_dir, bundle_zip, model_dir):
    source = FlashOnnx.load(model_dir)
    tok = source.tokenizer
    prompt, _ = tok.encode_prompt("guard", ["gruff"], "alert", "greet", {"time_of_day": "night"})
    for bundle in (bundle_dir.path, bundle_zip.path):
        loaded = FlashOnnx.load(bundle)
        assert loaded.bundle is not None and loaded.bundle.model_file == "model.ort"
        for seed in (0, 1, 2):
            assert loaded.generate_ids(prompt, seed=seed, max_tokens=24) == \
                source.generate_ids(prompt, seed=seed, max_tokens=24)
        logits, _, _ = loaded.step(np.asarray([prompt]), None)
        ref, _, _ = source.step(np.asarray([prompt]), None)
        assert np.abs(logits - ref).max() < 1e-3


def test_line_generator_on_a_bundle_gives_the_model_directory_lines(bundle_zip, model_dir):
    from runtime.client.generator import LineGenerator

    a = LineGenerator.load(bundle_zip.path, warmup=False)
    b = LineGenerator.load(model_dir, warmup=False)
    assert a.model is not None and a.model.bundle is not None
    try:
        for seed in range(3):
            la = a.generate("merchant", "working", intent="trade", seed=seed)
            lb = b.generate("merchant", "working", intent="trade", seed=seed)
            assert (la.text, la.fallback) == (lb.text, lb.fallback)
    finally:
        a.close()
        b.close()


def test_a_bundle_opens_with_the_ort_format_session_options(bundle_dir):
    model = FlashOnnx.load(bundle_dir.path)
    options = model.session.get_session_options()
    assert options.get_session_config_entry("session.load_model_format") == "ORT"
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert options.intra_op_num_threads == 1


def test_the_runtime_loads_a_bundle_without_torch_or_mobile_export(bundle_zip):
    code = ("import sys; from runtime.client.onnx_model import FlashOnnx; FlashOnnx.load(sys.argv[1]);"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'onnx', 'mobile_export')))")
    out = subprocess.run([sys.executable, "-c", code, str(bundle_zip.path)], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------ bad input


def test_an_existing_destination_is_refused_unless_forced(bundle_dir, model_dir, capsys):
    before = sha256_file(bundle_dir.path / "manifest.json")
    args = ["export", "mobile", "--model", str(model_dir), "--out", str(bundle_dir.path)]
    assert main(args) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert sha256_file(bundle_dir.path / "manifest.json") == before


def test_force_replaces_an_existing_bundle(model_dir, tmp_path):
    out = tmp_path / "b"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    done = export_bundle(model_dir, out, target="x86", force=True)
    assert not (out / "stale.txt").exists() and done.manifest["model"]["target"] == "x86"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]  # no temporary left behind


def test_a_missing_model_is_a_clear_error(tmp_path, capsys):
    assert main(["export", "mobile", "--model", str(tmp_path / "none"), "--out", str(tmp_path / "b")]) == 2
    assert "model.int4.onnx: missing" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_an_unknown_target_is_a_clear_error(model_dir, tmp_path, capsys):
    with pytest.raises(BundleExportError, match="unknown target 'mips'; known: arm, x86"):
        export_bundle(model_dir, tmp_path / "b", target="mips")
    with pytest.raises(SystemExit):
        main(["export", "mobile", "--target", "mips", "--out", str(tmp_path / "b")])
    assert "invalid choice: 'mips'" in capsys.readouterr().err


def test_a_failed_export_leaves_nothing_behind(model_dir, tmp_path):
    with pytest.raises(BundleExportError, match=r"over the 1000-byte budget"):
        export_bundle(model_dir, tmp_path / "b", zip_output=True, max_bytes=1000)
    assert list(tmp_path.iterdir()) == []


def test_export_mobile_refuses_the_flags_of_other_forms(model_dir, tmp_path, capsys):
    """``--accuracy-level`` is export onnx's, ``--bundle`` export client's: an error, not ignored."""
    argv = ["export", "mobile", "--model", str(model_dir), "--out", str(tmp_path / "b"),
            "--accuracy-level", "0", "--bundle", "/nonexistent"]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "unrecognized arguments: --accuracy-level 0 --bundle /nonexistent" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_resolve_model_path_maps_bundles_to_their_verified_model(bundle_dir, bundle_zip, model_dir, tmp_path):
    from runtime.client.bundle import resolve_model_path

    assert resolve_model_path(model_dir, "model.int4.onnx") == (model_dir, "model.int4.onnx")
    assert resolve_model_path(bundle_dir.path, "model.int4.onnx") == (bundle_dir.path, "model.ort")
    root, file = resolve_model_path(bundle_zip.path, "model.int4.onnx")
    assert file == "model.ort" and (root / "manifest.json").is_file() and root != bundle_zip.path
    assert sha256_file(root / file) == bundle_zip.manifest["files"][
        [e["path"] for e in bundle_zip.manifest["files"]].index("model.ort")]["sha256"]
    (tmp_path / "not.zip").write_text("plain text")
    with pytest.raises(BundleError, match="not a readable zip bundle"):
        resolve_model_path(tmp_path / "not.zip", "model.int4.onnx")


def test_a_tampered_zip_is_rejected_and_its_extraction_removed(bundle_zip, tmp_path):
    import runtime.client.bundle

    tampered = tmp_path / "tampered.zip"
    with zipfile.ZipFile(bundle_zip.path) as src, zipfile.ZipFile(tampered, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "model.ort":
                data = data[:100] + bytes([data[100] ^ 1]) + data[101:]
            dst.writestr(info, data)
    before = list(runtime.client.bundle._EXTRACTED)
    with pytest.raises(BundleError, match=r"tampered\.zip: bundle rejected: model\.ort: sha256 differs"):
        open_bundle(tampered)
    assert before == runtime.client.bundle._EXTRACTED


@pytest.mark.slow
def test_the_shipped_model_bundles_within_8_mb_and_verifies(tmp_path):
    from mobile_export.bundle import MAX_BUNDLE_BYTES

    done = export_bundle(DEFAULT_MODEL_DIR, tmp_path / "flash", zip_output=True)
    assert done.total_bytes <= MAX_BUNDLE_BYTES and done.zip_bytes <= MAX_BUNDLE_BYTES
    # under the onnxruntime that wrote model.ort (the oldest targeted) and the installed one
    report = verify_bundle(done.path, onnxruntime=[None, done.manifest["onnxruntime"]["built_with"]])
    assert report.ok, report.render()
    assert [w["cases"] for w in report.workers] == [80, 80]  # 10 archetypes x 8 states
    assert done.manifest["reference"]["cases"] == 80


def test_a_fine_tunes_authored_lines_travel_in_the_bundle_and_play_back(model_dir, tmp_path):
    import shutil

    from runtime.client.authored import AuthoredBook, AuthoredLine
    from runtime.client.generator import LineGenerator

    src = tmp_path / "studio_model"
    shutil.copytree(model_dir, src)
    line = "Caf\u00e9 first, haggling after."
    (src / "authored.json").write_text(json.dumps(AuthoredBook([AuthoredLine("merchant", "working", "trade",
                                                                             line)]).to_doc(), ensure_ascii=False))
    bundle = export_bundle(src, tmp_path / "bundle", target="arm")
    assert "authored.json" in {f["path"] for f in bundle.manifest["files"]}
    gen = LineGenerator.load(bundle.path, warmup=False)
    try:
        played = gen.generate("merchant", "working", intent="trade", seed=0)
        assert (played.text, played.finish_reason) == (line, "authored")
    finally:
        gen.close()
    (bundle.path / "authored.json").write_text("{}")  # a changed byte: the manifest's hash refuses it
    with pytest.raises(BundleError, match=r"authored\.json"):
        LineGenerator.load(bundle.path, warmup=False)
