"""Read and check a Flash model bundle (what ``flashnpc export mobile`` writes), without mobile_export.

A bundle is a directory, or a zip archive of the same files at its root, holding
``manifest.json`` and the files it lists: the model in onnxruntime's ORT format
(``model.ort``), ``required_operators.config``, ``tokenizer.json``, ``config.json``,
``catalog.json``, ``fallbacks.json``, ``constraints.json`` and ``reference.json``.
The manifest schema is specified in ``docs/mobile.md``.

Opening a bundle (:func:`open_bundle`) checks the manifest's schema and format version (a
newer version than :data:`BUNDLE_VERSION` is refused), refuses absolute paths and ``..`` in
it, and checks every listed file's size and SHA-256 (about 10 ms for an 8 MB bundle). A zip is
extracted, listed files only, into a private temporary directory removed at interpreter exit.

Only the standard library is used here, so a game client reads bundles with nothing extra.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import re
import shutil
import tempfile
import threading
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

BUNDLE_FORMAT = "flashnpc-bundle"
BUNDLE_VERSION = 1
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 1_000_000

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_REQUIRED_KEYS: dict[str, type | tuple[type, ...]] = {
    "format": str, "format_version": int, "model": dict, "created_at": str, "files": list,
    "vocab_size": int, "tokenizer": dict, "prompt": dict, "inputs": list, "outputs": list,
    "kv_cache": dict, "onnxruntime": dict, "operators": list,
}
_MODEL_KEYS: dict[str, type | tuple[type, ...]] = {"id": str, "version": str, "file": str, "format": str,
                                                   "target": str, "config": dict}


class BundleError(ValueError):
    """A bundle that cannot be used: the message names the bundle and what is wrong with it."""


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
    the model, tokenizer and config files listed.
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
    for name in (data["model"]["file"], "tokenizer.json", "config.json"):
        check_relative_path(name, f"{where}: model.file")
        if name not in seen:
            raise BundleError(f"{where}: {name} is not among the listed files")


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


def open_bundle(path: str | Path, *, verify_hashes: bool = True) -> Bundle:
    """Open and verify the bundle at ``path`` (a directory or a zip file).

    Raises :class:`BundleError` naming the bundle and the first thing wrong: no manifest, a
    manifest that fails :func:`check_manifest`, or files that are missing, truncated or
    altered (all of those listed). ``verify_hashes=False`` checks sizes only.
    """
    src = Path(path)
    if src.is_dir():
        mpath = src / MANIFEST
        if not mpath.is_file():
            raise BundleError(f"{src}: not a bundle (no {MANIFEST})")
        manifest = parse_manifest(mpath.read_bytes(), str(mpath))
        root, extracted = src, False
    elif src.is_file():
        manifest, root = _extract_zip(src)
        extracted = True
    else:
        raise BundleError(f"{src}: no such bundle (neither a directory nor a zip file)")
    stamp = _stamp(root, manifest)
    if not (verify_hashes and stamp is not None and _VERIFIED.get(root.resolve()) == stamp):
        problems = file_problems(root, manifest, hashes=verify_hashes)
        if problems:
            if extracted:
                _discard(root)
            raise BundleError(f"{src}: bundle rejected: " + "; ".join(problems))
        if verify_hashes and stamp is not None:
            _VERIFIED[root.resolve()] = stamp
    return Bundle(src, root, manifest, extracted, {e["path"]: e for e in manifest["files"]})


def _discard(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    with _EXTRACT_LOCK:
        if root in _EXTRACTED:
            _EXTRACTED.remove(root)


def _extract_zip(src: Path) -> tuple[dict[str, Any], Path]:
    root: Path | None = None
    try:
        with zipfile.ZipFile(src) as zf:
            try:
                raw = zf.read(MANIFEST)
            except KeyError:
                raise BundleError(f"{src}: zip has no {MANIFEST} at its root; not a bundle") from None
            manifest = parse_manifest(raw, f"{src}!{MANIFEST}")
            members = {info.filename: info for info in zf.infolist()}
            with _EXTRACT_LOCK:
                root = Path(tempfile.mkdtemp(prefix="flashnpc-bundle-"))
                _EXTRACTED.append(root)
            (root / MANIFEST).write_bytes(raw)  # the extracted directory is itself a bundle
            for entry in manifest["files"]:
                rel = entry["path"]
                info = members.get(rel)
                if info is None:
                    continue  # reported as missing by file_problems
                if info.file_size != entry["size"]:
                    raise BundleError(f"{src}: {rel}: {info.file_size} bytes in the zip, the manifest "
                                      f"says {entry['size']} (truncated or altered)")
                target = root / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as f_in, open(target, "wb") as f_out:
                    shutil.copyfileobj(f_in, f_out, 1 << 20)
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


def resolve_model_path(path: str | Path, file: str) -> tuple[Path, str]:
    """``(directory, model file)`` to load: ``(path, file)`` unchanged for a model directory;
    for a bundle (directory with a manifest, or zip) the verified (extracted) directory and the
    model file its manifest names. The hook :meth:`LineGenerator.load` uses for bundles."""
    p = Path(path)
    if not is_bundle(p):
        return p, file
    bundle = open_bundle(p)
    return bundle.root, bundle.model_file


__all__ = ["BUNDLE_FORMAT", "BUNDLE_VERSION", "MANIFEST", "Bundle", "BundleError", "check_manifest",
           "check_relative_path", "file_problems", "is_bundle", "open_bundle", "parse_manifest",
           "resolve_model_path", "sha256_file"]
