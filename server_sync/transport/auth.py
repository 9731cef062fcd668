"""Signed, expiring auth tokens (HMAC-SHA256).

A token is ``base64url(payload_json) + "." + base64url(hmac_sha256(secret, payload_b64))``
with payload ``{"sub": player_id, "exp": unix_seconds}``. Game backends mint tokens with
:func:`issue_token`; the server checks them with :func:`verify_token`. The secret comes from
the server's config or the ``FLASHNPC_SECRET`` environment variable (:func:`secret_from_env`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time

from .wire import MAX_ID_LEN, ProtocolError

__all__ = ["SECRET_ENV", "issue_token", "secret_from_env", "verify_token"]

SECRET_ENV = "FLASHNPC_SECRET"
MIN_SECRET_BYTES = 16


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _check_secret(secret: bytes) -> None:
    if not isinstance(secret, bytes) or len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"auth secret must be at least {MIN_SECRET_BYTES} bytes")


def secret_from_env(environ: dict[str, str] | None = None) -> bytes:
    """The secret in ``$FLASHNPC_SECRET``; ValueError naming the variable if unset or short."""
    value = (os.environ if environ is None else environ).get(SECRET_ENV, "")
    if len(value.encode()) < MIN_SECRET_BYTES:
        raise ValueError(f"set {SECRET_ENV} to a secret of at least {MIN_SECRET_BYTES} bytes")
    return value.encode()


def issue_token(secret: bytes, player_id: str, *, ttl_s: float = 3600.0,
                now: float | None = None) -> str:
    """A token for ``player_id`` that expires ``ttl_s`` seconds from ``now`` (default: now)."""
    _check_secret(secret)
    if not isinstance(player_id, str) or not 0 < len(player_id) <= MAX_ID_LEN:
        raise ValueError(f"player_id must be a string of 1..{MAX_ID_LEN} characters")
    exp = int((time.time() if now is None else now) + ttl_s)
    body = _b64(json.dumps({"sub": player_id, "exp": exp}, separators=(",", ":")).encode())
    sig = _b64(hmac.new(secret, body.encode(), hashlib.sha256).digest())
    return f"{body}.{sig}"


def verify_token(secret: bytes, token: str, *, now: float | None = None) -> str:
    """Return the token's player id; ProtocolError ``auth_failed`` or ``token_expired``."""
    _check_secret(secret)
    body, dot, sig = token.partition(".")
    if not dot or not body or not sig:
        raise ProtocolError("auth_failed", "token is not '<payload>.<signature>'")
    expected = _b64(hmac.new(secret, body.encode(), hashlib.sha256).digest())
    if not hmac.compare_digest(expected, sig):
        raise ProtocolError("auth_failed", "token signature does not match")
    try:
        payload = json.loads(_unb64(body))
        sub, exp = payload["sub"], payload["exp"]
    except (ValueError, KeyError, TypeError):
        raise ProtocolError("auth_failed", "token payload is not {sub, exp}") from None
    if not isinstance(sub, str) or not 0 < len(sub) <= MAX_ID_LEN or type(exp) is not int:
        raise ProtocolError("auth_failed", "token payload has a bad 'sub' or 'exp'")
    if (time.time() if now is None else now) >= exp:
        raise ProtocolError("token_expired", f"token expired at {exp}")
    return sub
