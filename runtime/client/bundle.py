"""Read and check a Flash model bundle (what ``flashnpc export mobile`` writes), without mobile_export.

A bundle is a directory, or a zip archive of the same files at its root, holding
``manifest.json`` and the files it lists: the model in onnxruntime's ORT format
(``model.ort``), ``required_operators.config``, ``tokenizer.json``, ``config.json``,
``catalog.json``, ``fallbacks.json``, ``constraints.json`` and ``reference.json``.
The manifest schema is specified in ``docs/mobile.md``.

Opening a bundle (:func:`open_bundle`) refuses, with one :class:`BundleError` naming the
bundle, the file and the reason:

* a manifest over 1 MB (its size is read from the directory entry or the zip's central
  directory before a byte of it is), not JSON, of another format or a newer format version
  than :data:`BUNDLE_VERSION`, missing a key, or with a key of the wrong type;
* a file list with an absolute path, ``..``, a duplicate, or without one of the files the
  runtime uses (:data:`REQUIRED_FILES`);
* for a zip: an unreadable archive, an entry name that appears twice (zip readers disagree on
  which copy counts), an entry the manifest does not list, uncompressed sizes over
  :data:`MAX_UNPACKED_BYTES` in all (from the central directory, before anything is
  inflated), a size that differs from the manifest's, data that does not inflate or fails its
  CRC; for a directory: a file the manifest does not list, a link leading outside it;
* a listed file missing, truncated, grown or altered (SHA-256; about 10 ms for 8 MB);
* ``config.json``, ``tokenizer.json`` or another JSON side file that is not a JSON object, and
  manifest fields that disagree with ``config.json`` (model config, vocabulary size, the KV
  cache's layers, heads and head size) or are out of range (``sampling``);
* (when the engine loads it, :func:`runtime.client.generator.LineGenerator.load`) a side file
  that does not parse as the engine parses it: ``constraints.json`` through
  :func:`runtime.client.constraints.constraints_file`, its word-bigram table (``bigrams``)
  included, whose every field is checked (:meth:`runtime.client.bigrams.BigramTable.from_json`:
  ids within the vocabulary and slots, offsets rising from 0 to the successor count with one
  per id, rows sorted; a table is at most (words + slots)² ids, so the unpacked-size cap bounds
  it too), the error naming the file and the field (``bigrams.offsets must hold ...``);
* with ``public_key``: no ``manifest.sig``, or one that is not that key's Ed25519 signature of
  the manifest (:mod:`runtime.client.signature`).

A zip is extracted, listed files only, into a private temporary directory removed at
interpreter exit (and at once when the bundle is refused).

Only the standard library is used here (``cryptography`` when a public key is given), so a
game client reads bundles with nothing extra.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import math
import re
import shutil
import tempfile
import threading
import zipfile
import zlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from runtime.client.errors import BundleError
from runtime.client.signature import MAX_SIGNATURE_BYTES, SIGNATURE, PublicKey, check_signature

BUNDLE_FORMAT = "flashnpc-bundle"
BUNDLE_VERSION = 1
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 1_000_000
MAX_UNPACKED_BYTES = 64_000_000  # every file of a bundle together, uncompressed
# the files the runtime reads, besides the model file the manifest names
REQUIRED_FILES = ("tokenizer.json", "config.json", "catalog.json", "fallbacks.json", "constraints.json")

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_REQUIRED_KEYS: dict[str, type | tuple[type, ...]] = {
    "format": str, "format_version": int, "model": dict, "created_at": str, "files": list,
    "vocab_size": int, "tokenizer": dict, "prompt": dict, "inputs": list, "outputs": list,
    "kv_cache": dict, "onnxruntime": dict, "operators": list,
}
_MODEL_KEYS: dict[str, type | tuple[type, ...]] = {"id": str, "version": str, "file": str, "format": str,
                                                   "target": str, "config": dict}


@dataclass
class Bundle:
    """An opened, verified bundle: ``root`` holds the files (the extraction directory for a zip)."""

    source: Path
    root: Path
    manifest: dict[str, Any]
    extracted: bool = False
    files: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def model_file(self) -> str:
        """The model's path relative to ``root`` (``model.ort``)."""
        return str(self.manifest["model"]["file"])

    @property
    def model_path(self) -> Path:
        return self.root / self.model_file


def is_bundle(path: str | Path) -> bool:
    """True for a directory holding ``manifest.json`` or for a file (taken to be a zip bundle)."""
    p = Path(path)
    return (p.is_dir() and (p / MANIFEST).is_file()) or p.is_file()


def parse_manifest(raw: bytes, where: str) -> dict[str, Any]:
    """Decode and schema-check manifest bytes; ``where`` names the manifest in errors."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise BundleError(f"{where}: {len(raw)} bytes, more than a manifest can be ({MAX_MANIFEST_BYTES})")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BundleError(f"{where}: not valid JSON ({exc})") from exc
    check_manifest(data, where)
    return data


def check_manifest(data: Any, where: str = MANIFEST) -> None:
    """Raise :class:`BundleError` unless ``data`` is a manifest this runtime can read.

    Checks, in order: an object with ``format`` = ``flashnpc-bundle``; ``format_version`` an
    int no newer than :data:`BUNDLE_VERSION`; every required key with its type; each file entry
    (``path`` relative, POSIX, no ``..``, unique; ``size`` >= 0; ``sha256`` 64 lower-case hex);
    the model file and every one of :data:`REQUIRED_FILES` listed; ``sampling`` in range.
    """
    if not isinstance(data, dict):
        raise BundleError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{where}: format is {data.get('format')!r}, expected {BUNDLE_FORMAT!r}")
    version = data.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise BundleError(f"{where}: format_version must be a positive integer, got {version!r}")
    if version > BUNDLE_VERSION:
        raise BundleError(f"{where}: bundle format version {version} is newer than this runtime "
                          f"reads (up to {BUNDLE_VERSION}); update flashnpc or re-export the bundle")
    _check_keys(data, _REQUIRED_KEYS, where)
    _check_keys(data["model"], _MODEL_KEYS, f"{where}: model")
    seen: set[str] = set()
    for i, entry in enumerate(data["files"]):
        if not isinstance(entry, dict):
            raise BundleError(f"{where}: files[{i}] must be an object with path, size, sha256")
        path = entry.get("path")
        check_relative_path(path, f"{where}: files[{i}].path")
        if path in seen:
            raise BundleError(f"{where}: {path!r} is listed twice")
        seen.add(path)
        size = entry.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BundleError(f"{where}: {path}: size must be a non-negative integer, got {size!r}")
        digest = entry.get("sha256")
        if not isinstance(digest, str) or not _SHA256_RE.match(digest):
            raise BundleError(f"{where}: {path}: sha256 must be 64 lower-case hex digits, got {digest!r}")
    if MANIFEST in seen:
        raise BundleError(f"{where}: the manifest cannot list itself")
    check_relative_path(data["model"]["file"], f"{where}: model.file")
    for name in (data["model"]["file"], *REQUIRED_FILES):
        if name not in seen:
            raise BundleError(f"{where}: {name} is not among the listed files (the runtime needs it)")
    if SIGNATURE in seen:
        raise BundleError(f"{where}: the manifest cannot list {SIGNATURE} (the signature covers the manifest)")
    _check_sampling(data.get("sampling"), where)


def _check_sampling(sampling: Any, where: str) -> None:
    if sampling is None:
        return
    if not isinstance(sampling, dict):
        raise BundleError(f"{where}: sampling must be an object, got {type(sampling).__name__}")
    checks = {
        "temperature": lambda v: _is_number(v) and 0 <= v <= 10,
        "top_p": lambda v: _is_number(v) and 0 < v <= 1,
        "top_k": lambda v: _is_int(v) and v >= 0,
        "max_tokens": lambda v: _is_int(v) and 0 < v <= 4096,
    }
    for key, ok in checks.items():
        if key in sampling and not ok(sampling[key]):
            raise BundleError(f"{where}: sampling.{key} = {sampling[key]!r} is out of range")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def check_against_config(root: Path, manifest: Mapping[str, Any], where: str) -> None:
    """The listed JSON side files must be JSON objects, and the manifest's description of the
    model must agree with ``config.json`` (the file the engine builds its tensors from)."""
    docs: dict[str, Any] = {}
    for entry in manifest["files"]:
        rel = entry["path"]
        if not rel.endswith(".json"):
            continue
        try:
            docs[rel] = json.loads((root / rel).read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise BundleError(f"{where}: bundle rejected: {rel}: not valid JSON ({exc})") from exc
        if not isinstance(docs[rel], dict):
            raise BundleError(f"{where}: bundle rejected: {rel}: expected a JSON object, "
                              f"got {type(docs[rel]).__name__}")
    config = docs["config.json"]
    if manifest["model"]["config"] != config:
        raise BundleError(f"{where}: bundle rejected: manifest.json: model.config differs from config.json")
    try:
        n_layer, n_head, n_embd = int(config["n_layer"]), int(config["n_head"]), int(config["n_embd"])
        expected = {"vocab_size": int(config["vocab_size"]), "kv_cache.n_layer": n_layer,
                    "kv_cache.n_head": n_head, "kv_cache.head_dim": n_embd // max(n_head, 1)}
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"{where}: bundle rejected: config.json: missing or bad field ({exc})") from exc
    kv = manifest["kv_cache"]
    found = {"vocab_size": manifest["vocab_size"], "kv_cache.n_layer": kv.get("n_layer"),
             "kv_cache.n_head": kv.get("n_head"), "kv_cache.head_dim": kv.get("head_dim")}
    for key, value in expected.items():
        if found[key] != value:
            raise BundleError(f"{where}: bundle rejected: manifest.json: {key} is {found[key]!r}, "
                              f"config.json gives {value}")


def check_relative_path(path: Any, where: str) -> None:
    """Refuse anything but a plain relative POSIX path inside the bundle."""
    if not isinstance(path, str) or not path:
        raise BundleError(f"{where}: must be a non-empty string, got {path!r}")
    if "\\" in path or "\x00" in path:
        raise BundleError(f"{where}: {path!r} contains a backslash or NUL; paths use '/'")
    pure = PurePosixPath(path)
    if pure.is_absolute() or re.match(r"^[A-Za-z]:", path):
        raise BundleError(f"{where}: {path!r} is an absolute path; bundle paths are relative")
    if any(part in ("..", ".") for part in path.split("/")) or "" in path.split("/"):
        raise BundleError(f"{where}: {path!r} contains '..', '.' or an empty part; "
                          "bundle paths must stay inside the bundle")


def _check_keys(obj: Mapping[str, Any], spec: Mapping[str, type | tuple[type, ...]], where: str) -> None:
    for key, kind in spec.items():
        if key not in obj:
            raise BundleError(f"{where}: missing key {key!r}")
        value = obj[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise BundleError(f"{where}: {key!r} must be {getattr(kind, '__name__', kind)}, "
                              f"got {type(value).__name__}")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_problems(root: Path, manifest: Mapping[str, Any], *, hashes: bool = True) -> list[str]:
    """Every listed file that is missing, outside ``root``, of the wrong size or (with
    ``hashes``) the wrong SHA-256, as one message each naming the file; empty when all hold."""
    problems: list[str] = []
    base = root.resolve()
    for entry in manifest["files"]:
        rel = entry["path"]
        path = root / rel
        if not path.is_file():
            problems.append(f"{rel}: missing")
            continue
        if not path.resolve().is_relative_to(base):
            problems.append(f"{rel}: resolves outside the bundle (a link?)")
            continue
        size = path.stat().st_size
        if size != entry["size"]:
            how = "truncated" if size < entry["size"] else "grown"
            problems.append(f"{rel}: {size} bytes, the manifest says {entry['size']} ({how})")
            continue
        if hashes and sha256_file(path) != entry["sha256"]:
            problems.append(f"{rel}: sha256 differs from the manifest (file altered)")
    listed = {MANIFEST, SIGNATURE, *(e["path"] for e in manifest["files"])}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_dir() and not path.is_symlink():
            continue
        if rel not in listed:
            problems.append(f"{rel}: not listed in the manifest")
    return problems


# extraction directories of zip bundles, removed at exit
_EXTRACTED: list[Path] = []
_EXTRACT_LOCK = threading.Lock()


def _remove_extracted() -> None:
    for path in _EXTRACTED:
        shutil.rmtree(path, ignore_errors=True)


atexit.register(_remove_extracted)


# directories whose files were hashed, with the (size, mtime, ctime, inode) of
# each at the time: opening the
# same unchanged directory again (the engine opens it once, its model loader again) skips hashing
_VERIFIED: dict[Path, tuple[tuple[str, int, int, int, int], ...]] = {}


def _stamp(root: Path, manifest: Mapping[str, Any]) -> tuple[tuple[str, int, int, int, int], ...] | None:
    out = []
    for rel in [MANIFEST, *(e["path"] for e in manifest["files"])]:
        try:
            st = (root / rel).stat()
        except OSError:
            return None
        out.append((rel, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
    return tuple(out)


def open_bundle(path: str | Path, *, verify_hashes: bool = True, public_key: PublicKey | None = None) -> Bundle:
    """Open and verify the bundle at ``path`` (a directory or a zip file).

    Raises :class:`BundleError` naming the bundle and the first thing wrong (see the module
    docstring); for files that are missing, truncated, altered or unlisted, all of them.
    ``verify_hashes=False`` checks sizes only. ``public_key`` (raw 32 bytes, hex or PEM, see
    :func:`runtime.client.signature.raw_public_key`): refuse the bundle unless that key signed it.
    """
    src = Path(path)
    if src.is_dir():
        mpath = src / MANIFEST
        if not mpath.is_file():
            raise BundleError(f"{src}: not a bundle (no {MANIFEST})")
        size = mpath.stat().st_size
        if size > MAX_MANIFEST_BYTES:
            raise BundleError(f"{mpath}: {size} bytes, more than a manifest can be ({MAX_MANIFEST_BYTES})")
        raw = mpath.read_bytes()
        manifest = parse_manifest(raw, str(mpath))
        root, extracted = src, False
        sig_path = src / SIGNATURE
        if public_key is not None:
            if sig_path.is_file():
                _check_signature_size(src, sig_path.stat().st_size)
            signature = sig_path.read_bytes() if sig_path.is_file() else None
            check_signature(raw, signature, public_key, str(src))
    elif src.is_file():
        manifest, root = _extract_zip(src, public_key)
        extracted = True
    else:
        raise BundleError(f"{src}: no such bundle (neither a directory nor a zip file)")
    try:
        stamp = _stamp(root, manifest)
        if not (verify_hashes and stamp is not None and _VERIFIED.get(root.resolve()) == stamp):
            problems = file_problems(root, manifest, hashes=verify_hashes)
            if problems:
                raise BundleError(f"{src}: bundle rejected: " + "; ".join(problems))
            check_against_config(root, manifest, str(src))
            if verify_hashes and stamp is not None:
                _VERIFIED[root.resolve()] = stamp
    except BaseException:
        if extracted:
            _discard(root)
        raise
    return Bundle(src, root, manifest, extracted, {e["path"]: e for e in manifest["files"]})


def discard_extraction(root: Path) -> None:
    """Remove a zip bundle's extraction directory now (a no-op for any other directory)."""
    with _EXTRACT_LOCK:
        if root not in _EXTRACTED:
            return
    _discard(root)


def _discard(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    with _EXTRACT_LOCK:
        if root in _EXTRACTED:
            _EXTRACTED.remove(root)


def _extract_zip(src: Path, public_key: PublicKey | None) -> tuple[dict[str, Any], Path]:
    """Check the archive's directory, then its manifest, then extract the listed files."""
    root: Path | None = None
    try:
        with zipfile.ZipFile(src) as zf:
            infos = zf.infolist()
            _check_zip_directory(src, infos)
            members = {info.filename: info for info in infos}
            minfo = members.get(MANIFEST)
            if minfo is None:
                raise BundleError(f"{src}: zip has no {MANIFEST} at its root; not a bundle")
            if minfo.file_size > MAX_MANIFEST_BYTES:
                raise BundleError(f"{src}!{MANIFEST}: {minfo.file_size} bytes, more than a manifest "
                                  f"can be ({MAX_MANIFEST_BYTES})")
            raw = _read_member(zf, minfo, src)
            manifest = parse_manifest(raw, f"{src}!{MANIFEST}")
            if public_key is not None:
                sinfo = members.get(SIGNATURE)
                if sinfo is not None:
                    _check_signature_size(src, sinfo.file_size)
                signature = _read_member(zf, sinfo, src) if sinfo is not None else None
                check_signature(raw, signature, public_key, str(src))
            listed = {e["path"]: e for e in manifest["files"]}
            unlisted = sorted(set(members) - set(listed) - {MANIFEST, SIGNATURE})
            if unlisted:
                raise BundleError(f"{src}: bundle rejected: {', '.join(unlisted[:5])}"
                                  f"{f' and {len(unlisted) - 5} more' if len(unlisted) > 5 else ''}: "
                                  "in the zip but not listed in the manifest")
            with _EXTRACT_LOCK:
                root = Path(tempfile.mkdtemp(prefix="flashnpc-bundle-"))
                _EXTRACTED.append(root)
            (root / MANIFEST).write_bytes(raw)  # the extracted directory is itself a bundle
            for rel, entry in listed.items():
                info = members.get(rel)
                if info is None:
                    continue  # reported as missing by file_problems
                if info.file_size != entry["size"]:
                    raise BundleError(f"{src}: bundle rejected: {rel}: {info.file_size} bytes in the zip, "
                                      f"the manifest says {entry['size']} (truncated or altered)")
                target = root / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                _extract_member(zf, info, target, src)
    except BaseException as exc:
        if root is not None:
            _discard(root)
        if isinstance(exc, zipfile.BadZipFile):
            raise BundleError(f"{src}: not a readable zip bundle (corrupt or truncated: {exc})") from exc
        if isinstance(exc, (OSError, EOFError, zipfile.LargeZipFile)):
            raise BundleError(f"{src}: cannot read the zip bundle ({type(exc).__name__}: {exc})") from exc
        raise
    assert root is not None
    return manifest, root


def _check_signature_size(src: Path, size: int) -> None:
    if size > MAX_SIGNATURE_BYTES:
        raise BundleError(f"{src}: bundle rejected: {SIGNATURE}: {size} bytes, more than a signature "
                          f"file can be ({MAX_SIGNATURE_BYTES})")


def _check_zip_directory(src: Path, infos: list[zipfile.ZipInfo]) -> None:
    """Names unique, sizes bounded: from the central directory, before anything is inflated."""
    twice = sorted(name for name, n in Counter(i.filename for i in infos).items() if n > 1)
    if twice:
        raise BundleError(f"{src}: bundle rejected: {', '.join(twice[:5])}: the zip holds this name more "
                          "than once (zip readers disagree on which copy counts)")
    total = sum(i.file_size for i in infos)
    if total > MAX_UNPACKED_BYTES:
        biggest = max(infos, key=lambda i: i.file_size)
        raise BundleError(f"{src}: bundle rejected: its entries unpack to {total} bytes, over the "
                          f"{MAX_UNPACKED_BYTES}-byte limit (largest: {biggest.filename}, {biggest.file_size} bytes)")


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, src: Path) -> bytes:
    try:
        return zf.read(info)
    except (zlib.error, zipfile.BadZipFile, EOFError) as exc:
        raise BundleError(f"{src}: bundle rejected: {info.filename}: its data in the zip is corrupt "
                          f"({type(exc).__name__}: {exc})") from exc


def _extract_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path, src: Path) -> None:
    try:
        with zf.open(info) as f_in, open(target, "wb") as f_out:
            shutil.copyfileobj(f_in, f_out, 1 << 20)
    except (zlib.error, zipfile.BadZipFile, EOFError) as exc:
        raise BundleError(f"{src}: bundle rejected: {info.filename}: its data in the zip is corrupt "
                          f"({type(exc).__name__}: {exc})") from exc


def resolve_model_path(path: str | Path, file: str, *, public_key: PublicKey | None = None) -> tuple[Path, str]:
    """``(directory, model file)`` to load: ``(path, file)`` unchanged for a model directory;
    for a bundle (directory with a manifest, or zip) the verified (extracted) directory and the
    model file its manifest names. The hook :meth:`LineGenerator.load` uses for bundles. With
    ``public_key`` only a bundle that key signed is accepted (a model directory is refused)."""
    p = Path(path)
    if not is_bundle(p):
        if public_key is not None:
            raise BundleError(f"{p}: a public key is set, so only a signed bundle loads, and this is "
                              "a model directory")
        return p, file
    bundle = open_bundle(p, public_key=public_key)
    return bundle.root, bundle.model_file


__all__ = ["BUNDLE_FORMAT", "BUNDLE_VERSION", "MANIFEST", "MAX_UNPACKED_BYTES", "REQUIRED_FILES", "Bundle",
           "BundleError", "check_against_config", "check_manifest",
           "check_relative_path", "discard_extraction", "file_problems", "is_bundle", "open_bundle", "parse_manifest",
           "resolve_model_path", "sha256_file"]
