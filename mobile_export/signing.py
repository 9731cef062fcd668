"""Sign bundles: ``flashnpc bundle keygen`` and ``flashnpc bundle sign``.

A signature is an Ed25519 signature of the bundle's ``manifest.json`` bytes, stored beside it
as ``manifest.sig`` (format: :mod:`runtime.client.signature`); the manifest lists every other file
with its SHA-256, so one signature covers the bundle. A game that sets a public key
(``LineGenerator.load(bundle, public_key=...)``) loads only bundles that key signed; one that
sets none loads them as before. Needs ``cryptography`` (``pip install 'flashnpc[sign]'``).
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from mobile_export.bundle import zip_entry
from runtime.client.bundle import MANIFEST, BundleError, open_bundle
from runtime.client.signature import SIGNATURE, key_id, signature_document


class SigningError(BundleError):
    """A key or bundle that can't be signed with: the message says which and why."""


def _crypto() -> tuple[Any, Any]:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:
        raise SigningError("signing bundles needs the 'cryptography' package: pip install 'flashnpc[sign]'") from exc
    return serialization, ed25519


def generate_key(out: str | Path, *, force: bool = False) -> tuple[Path, Path]:
    """Write a new Ed25519 key pair: ``out`` (the private key, PEM PKCS#8, mode 0600) and
    ``out.pub`` (the public key, PEM, for the game). Refuses to overwrite unless ``force``."""
    serialization, ed25519 = _crypto()
    private_path, public_path = Path(out), Path(str(out) + ".pub")
    for path in (private_path, public_path):
        if path.exists() and not force:
            raise SigningError(f"{path} already exists; pass --force to replace it")
    key = ed25519.Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    private_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private_pem)
    public_path.write_bytes(public_pem)
    return private_path, public_path


def load_private_key(path: str | Path) -> Any:
    serialization, ed25519 = _crypto()
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except OSError as exc:
        raise SigningError(f"{path}: cannot read the key ({exc})") from exc
    except (ValueError, TypeError) as exc:
        raise SigningError(f"{path}: not an unencrypted PEM private key ({exc})") from exc
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise SigningError(f"{path}: a {type(key).__name__}, not an Ed25519 private key")
    return key


def sign_bundle(path: str | Path, key_path: str | Path) -> str:
    """Sign the bundle at ``path`` (directory or zip) in place with the private key at
    ``key_path``; returns the key id. The bundle is verified first (a bundle that fails any
    check is not signed), and a zip is rewritten to a temporary sibling and renamed."""
    serialization, _ = _crypto()
    key = load_private_key(key_path)
    src = Path(path)
    open_bundle(src)  # never sign a bundle that doesn't verify
    raw_public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    if src.is_dir():
        manifest = (src / MANIFEST).read_bytes()
        (src / SIGNATURE).write_bytes(signature_document(key.sign(manifest), raw_public))
        return key_id(raw_public)
    with zipfile.ZipFile(src) as zf:
        manifest = zf.read(MANIFEST)
        entries = [(info, zf.read(info)) for info in zf.infolist() if info.filename != SIGNATURE]
    document = signature_document(key.sign(manifest), raw_public)
    fd, tmp = tempfile.mkstemp(prefix=f".{src.name}.sign-", dir=src.parent)
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as out:
            for info, data in entries:
                out.writestr(info, data)
            out.writestr(zip_entry(SIGNATURE), document)
        os.replace(tmp, src)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return key_id(raw_public)


__all__ = ["SigningError", "generate_key", "load_private_key", "sign_bundle"]
