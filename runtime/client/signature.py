"""Ed25519 signatures over a bundle's manifest: what a game checks (``public_key=``).

A signed bundle holds ``manifest.sig`` beside ``manifest.json``: a JSON object
``{"algorithm": "ed25519", "key_id": K, "signature": S}`` where ``S`` is the base64 of the
64-byte Ed25519 signature of the ``manifest.json`` file's bytes exactly as stored, and ``K``
the first 16 hex digits of the SHA-256 of the 32-byte raw public key (to tell keys apart in
error messages; it is not trusted). The manifest lists every other file with its SHA-256, so
the signature covers the whole bundle.

Verifying needs the ``cryptography`` package (``pip install 'flashnpc[sign]'``), imported only
when a key is given: a game that sets no key loads bundles as before, with nothing extra.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from runtime.client.errors import BundleError

SIGNATURE = "manifest.sig"
ALGORITHM = "ed25519"
MAX_SIGNATURE_BYTES = 4096
_HEX_KEY = re.compile(r"^[0-9a-fA-F]{64}$")

PublicKey = bytes | str | Path


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:
        raise BundleError("checking a bundle signature needs the 'cryptography' package: "
                          "pip install 'flashnpc[sign]'") from exc
    return ed25519


def raw_public_key(key: PublicKey) -> bytes:
    """The 32 raw bytes of an Ed25519 public key given as raw bytes, 64 hex digits, PEM text
    (``-----BEGIN PUBLIC KEY-----``), or a path to a file holding either form."""
    if isinstance(key, Path):
        try:
            key = key.read_bytes()
        except OSError as exc:
            raise BundleError(f"{key}: cannot read the public key ({exc})") from exc
    if isinstance(key, str):
        key = key.encode("ascii", "replace")
    if len(key) == 32 and not key.strip().startswith(b"-----"):
        return bytes(key)
    text = key.strip()
    if _HEX_KEY.match(text.decode("ascii", "replace")):
        return bytes.fromhex(text.decode("ascii"))
    if text.startswith(b"-----BEGIN PUBLIC KEY-----"):
        ed25519 = _crypto()
        from cryptography.hazmat.primitives import serialization

        try:
            loaded = serialization.load_pem_public_key(text)
        except ValueError as exc:
            raise BundleError(f"public key: not a readable PEM key ({exc})") from exc
        if not isinstance(loaded, ed25519.Ed25519PublicKey):
            raise BundleError(f"public key: a {type(loaded).__name__}, not an Ed25519 key")
        return loaded.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    raise BundleError("public key: expected 32 raw bytes, 64 hex digits or a PEM 'PUBLIC KEY'")


def key_id(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[:16]


def signature_document(signature: bytes, raw_public: bytes) -> bytes:
    """The ``manifest.sig`` file for a signature made with the key whose public half is given."""
    doc = {"algorithm": ALGORITHM, "key_id": key_id(raw_public),
           "signature": base64.b64encode(signature).decode("ascii")}
    return (json.dumps(doc, indent=1) + "\n").encode("utf-8")


def check_signature(manifest: bytes, signature: bytes | None, key: PublicKey, where: str) -> None:
    """Raise :class:`BundleError` (naming ``where``) unless ``signature`` (the ``manifest.sig``
    bytes, None when the bundle has none) is a valid Ed25519 signature of ``manifest`` by
    ``key``."""
    raw = raw_public_key(key)
    if signature is None:
        raise BundleError(f"{where}: bundle rejected: unsigned (no {SIGNATURE}), and this game "
                          f"only loads bundles signed by key {key_id(raw)}")
    try:
        doc = json.loads(signature.decode("utf-8"))
        if not isinstance(doc, dict) or doc.get("algorithm") != ALGORITHM:
            raise ValueError(f"algorithm must be {ALGORITHM!r}")
        sig = base64.b64decode(str(doc["signature"]), validate=True)
    except (UnicodeDecodeError, ValueError, KeyError, binascii.Error) as exc:
        raise BundleError(f"{where}: bundle rejected: {SIGNATURE}: not a signature file ({exc})") from exc
    ed25519 = _crypto()
    from cryptography.exceptions import InvalidSignature

    try:
        ed25519.Ed25519PublicKey.from_public_bytes(raw).verify(sig, manifest)
    except (InvalidSignature, ValueError):
        signer = doc.get("key_id")
        raise BundleError(f"{where}: bundle rejected: {SIGNATURE}: the signature does not match "
                          f"manifest.json for key {key_id(raw)} (signed by {signer!r}, or altered "
                          "after signing)") from None


__all__ = ["MAX_SIGNATURE_BYTES", "SIGNATURE", "check_signature", "key_id", "raw_public_key", "signature_document"]
