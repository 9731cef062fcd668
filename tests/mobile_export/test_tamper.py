"""Tampered bundles: every one refused with one BundleError naming the file and the reason,
by LineGenerator.load (either on_error), `flashnpc bundle verify` and the packaged client."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mobile_export.verify import verify_bundle
from plugin.cli import main
from runtime.client.bundle import MAX_MANIFEST_BYTES, MAX_UNPACKED_BYTES, BundleError
from runtime.client.generator import LineGenerator, ModelLoadError

Entries = list[tuple[str, bytes]]


def entries_of(bundle: Path) -> Entries:
    with zipfile.ZipFile(bundle) as zf:
        return [(info.filename, zf.read(info)) for info in zf.infolist()]


def write_zip(path: Path, entries: Entries, *, stored: set[str] = frozenset()) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED if name in stored else zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return path


def rewritten(bundle: Path, tmp_path: Path, change: Callable[[dict[str, bytes]], None],
              manifest: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """A copy of the zip bundle with files changed by ``change``, and the manifest rehashed to
    agree (a consistent forgery), then edited by ``manifest``."""
    files = dict(entries_of(bundle))
    change(files)
    m = json.loads(files["manifest.json"])
    m["files"] = [{"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                  for name, data in files.items() if name not in ("manifest.json", "manifest.sig")
                  and any(e["path"] == name for e in m["files"])]
    if manifest is not None:
        manifest(m)
    files["manifest.json"] = json.dumps(m).encode()
    return write_zip(tmp_path / "forged.zip", list(files.items()))


def refused(path: Path, *reason: str) -> str:
    """Assert every reader refuses ``path`` with one clean error holding ``reason``."""
    for on_error in ("raise", "fallback"):
        with pytest.raises(BundleError) as err:
            LineGenerator.load(path, warmup=False, on_error=on_error)
        for part in reason:
            assert part in str(err.value), (on_error, str(err.value))
    report = verify_bundle(path)
    assert not report.ok
    detail = next(c.detail for c in report.checks if not c.ok)
    for part in reason:
        assert part in detail, detail
    return str(err.value)


def test_a_bit_flip_that_breaks_inflate_is_refused_naming_the_entry(bundle_zip, tmp_path):
    raw = bytearray(bundle_zip.path.read_bytes())
    with zipfile.ZipFile(bundle_zip.path) as zf:
        info = zf.getinfo("model.ort")
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    for k in range(64):  # scramble the deflate stream's block headers
        raw[start + k] ^= 0xA5
    broken = tmp_path / "inflate.zip"
    broken.write_bytes(bytes(raw))
    refused(broken, "model.ort", "corrupt")


@pytest.mark.filterwarnings("ignore:Duplicate name")
def test_a_zip_naming_one_file_twice_is_refused(bundle_zip, tmp_path):
    entries = entries_of(bundle_zip.path)
    fallbacks = next(data for name, data in entries if name == "fallbacks.json")
    forged = write_zip(tmp_path / "twice.zip", [*entries, ("fallbacks.json", fallbacks.replace(b"a", b"b"))])
    refused(forged, "fallbacks.json", "more than once")


def test_an_entry_the_manifest_does_not_list_is_refused(bundle_zip, tmp_path):
    forged = write_zip(tmp_path / "extra.zip", [*entries_of(bundle_zip.path), ("payload.bin", b"\x7fELF")])
    refused(forged, "payload.bin", "not listed in the manifest")


def test_an_oversized_entry_is_refused_from_the_central_directory_before_inflating(bundle_zip, tmp_path):
    big = tmp_path / "big.zip"
    with zipfile.ZipFile(big, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries_of(bundle_zip.path):
            zf.writestr(name, data)
        with zf.open("padding.bin", "w", force_zip64=True) as f:
            chunk = bytes(1 << 20)
            for _ in range(MAX_UNPACKED_BYTES // len(chunk) + 2):
                f.write(chunk)
    assert big.stat().st_size < 1_000_000  # zeros deflate to almost nothing
    refused(big, "unpack to", "over the", "padding.bin")


def test_a_padded_manifest_is_refused_by_its_declared_size(bundle_zip, tmp_path):
    entries = [(n, d + b" " * (MAX_MANIFEST_BYTES + 1) if n == "manifest.json" else d)
               for n, d in entries_of(bundle_zip.path)]
    refused(write_zip(tmp_path / "padded.zip", entries), "manifest.json", "more than a manifest can be")


@pytest.mark.parametrize("name", ["fallbacks.json", "constraints.json", "catalog.json"])
def test_a_file_the_runtime_uses_dropped_from_the_manifest_is_refused(bundle_zip, tmp_path, name):
    forged = rewritten(bundle_zip.path, tmp_path, lambda files: files.pop(name))
    refused(forged, name, "not among the listed files")


@pytest.mark.parametrize(("name", "content", "reason"), [
    ("constraints.json", b"{}", "missing key 'slot_rules'"),
    ("constraints.json", b'{"banned_words": 3, "slots": [], "slot_rules": {"archetype": {}, "state": {}, '
                         b'"intent": {}}}', "banned_words must be a list"),
    ("fallbacks.json", b"[1, 2]", "expected a JSON object"),
    ("fallbacks.json", b'{"guard": {"idle": "Halt"}}', "must be a list of strings"),
    ("catalog.json", b'{"archetypes": 5}', "archetypes, states and intents"),
    ("tokenizer.json", b"\xff\xfe", "not valid JSON"),
])
def test_a_malformed_side_file_is_refused_naming_it(bundle_zip, tmp_path, name, content, reason):
    def change(files: dict[str, bytes]) -> None:
        files[name] = content
    refused(rewritten(bundle_zip.path, tmp_path, change), name, reason)


@pytest.mark.parametrize(("change", "reason"), [
    (lambda m: m["kv_cache"].update(n_head=m["kv_cache"]["n_head"] * 2), "kv_cache.n_head"),
    (lambda m: m["kv_cache"].update(head_dim=7), "kv_cache.head_dim"),
    (lambda m: m.update(vocab_size=m["vocab_size"] + 1), "vocab_size"),
    (lambda m: m["model"]["config"].update(n_layer=99), "model.config differs from config.json"),
    (lambda m: m["sampling"].update(top_p=5), "sampling.top_p = 5 is out of range"),
    (lambda m: m["sampling"].update(temperature=float("nan")), "sampling.temperature"),
    (lambda m: m["sampling"].update(max_tokens=True), "sampling.max_tokens"),
])
def test_manifest_fields_that_disagree_with_config_json_are_refused(bundle_zip, tmp_path, change, reason):
    refused(rewritten(bundle_zip.path, tmp_path, lambda files: None, change), reason)


def test_a_link_in_a_directory_bundle_is_refused(bundle_dir, tmp_path):
    import shutil

    root = tmp_path / "linked"
    shutil.copytree(bundle_dir.path, root)
    outside = tmp_path / "outside.json"
    outside.write_bytes((root / "fallbacks.json").read_bytes())
    (root / "fallbacks.json").unlink()
    (root / "fallbacks.json").symlink_to(outside)
    refused(root, "fallbacks.json", "outside the bundle")


def test_an_unlisted_file_in_a_directory_bundle_is_refused(bundle_dir, tmp_path):
    import shutil

    root = tmp_path / "extra"
    shutil.copytree(bundle_dir.path, root)
    (root / "notes.txt").write_text("hello")
    refused(root, "notes.txt", "not listed in the manifest")


def test_a_refused_zip_leaves_no_extraction_behind(bundle_zip, tmp_path):
    import runtime.client.bundle

    for change in ({"constraints.json": b"{}"}, {"tokenizer.json": b"[]"}):
        forged = rewritten(bundle_zip.path, tmp_path, lambda files, change=change: files.update(change))
        before = list(runtime.client.bundle._EXTRACTED)
        with pytest.raises(BundleError):
            LineGenerator.load(forged, warmup=False)
        assert before == runtime.client.bundle._EXTRACTED


def test_bundle_verify_reports_a_tampered_bundle_in_one_line_and_exit_1(bundle_zip, tmp_path, capsys):
    forged = write_zip(tmp_path / "extra.zip", [*entries_of(bundle_zip.path), ("x.bin", b"1")])
    assert main(["bundle", "verify", str(forged)]) == 1
    out = capsys.readouterr().out
    assert "x.bin: in the zip but not listed in the manifest" in out and "Traceback" not in out


def test_the_packaged_client_turns_a_tampered_bundle_into_one_line_and_exit_2(bundle_zip, tmp_path):
    forged = write_zip(tmp_path / "extra.zip", [*entries_of(bundle_zip.path), ("x.bin", b"1")])
    proc = subprocess.run([sys.executable, "-m", "mobile_export.client_main", "--bundle", str(forged)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    assert "x.bin: in the zip but not listed in the manifest" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_fallback_mode_serves_the_bundles_own_lines_without_pyyaml(bundle_zip, tmp_path):
    """An intact bundle whose model onnxruntime can't load (here: a consistently rehashed,
    unreadable model.ort, which only a signature would catch) serves its verified fallback
    lines in fallback mode, in a process where PyYAML can't be imported."""
    forged = rewritten(bundle_zip.path, tmp_path, lambda files: files.update({"model.ort": b"not a model"}))
    script = (
        "import sys, importlib.abc\n"
        "class NoYaml(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'yaml' or name.startswith('yaml.'):\n"
        "            raise ImportError('no yaml here')\n"
        "sys.meta_path.insert(0, NoYaml())\n"
        "from runtime.client.generator import LineGenerator\n"
        f"gen = LineGenerator.load({str(forged)!r}, on_error='fallback', warmup=False)\n"
        "line = gen.generate('guard', 'alert', intent='greet', seed=1)\n"
        "print(line.fallback, line.fallback_reason, bool(line.text))\n"
        "print('yaml' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          check=False, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "model_unavailable", "True", "False"]
    with pytest.raises(ModelLoadError):
        LineGenerator.load(forged, warmup=False)  # and in raise mode it names the model


def test_the_intact_bundle_still_loads_and_verifies(bundle_zip, bundle_dir):
    for path in (bundle_zip.path, bundle_dir.path):
        gen = LineGenerator.load(path, warmup=False)
        assert gen.generate("guard", "alert", intent="greet", seed=1).text
        gen.close()
