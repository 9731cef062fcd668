"""Auth tokens: JSON Web Tokens (RFC 7519) checked with PyJWT.

A game's backend mints a JWT per player; both servers check it in the ``hello``
(:class:`TokenVerifier`):

* ``HS256`` signed with the server secret (``$FLASHNPC_SECRET``, at least 32 bytes, RFC 7518
  section 3.2), or, when the server is given a public key, the algorithm of that key: ``RS256``
  (RSA), ``ES256`` (EC P-256) or ``EdDSA`` (Ed25519), so a backend can sign tokens the server
  verifies without sharing a secret. No other algorithm is accepted (never ``none``).
* claims: ``sub`` (required, the player id: a string of 1..64 characters), ``exp`` (required,
  a NumericDate: seconds since the Unix epoch), ``aud`` (required, must be the server's
  audience, ``flashnpc`` unless configured), ``nbf`` (optional: not valid before).
* the token text must be three base64url segments without padding.

:func:`issue_token` mints an HS256 token (tests, ``flashnpc serve --issue-token``).
:class:`RevokedTokens` remembers tokens a client ended with ``bye`` until they expire.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import os
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

import jwt

from .wire import MAX_ID_LEN, ProtocolError

__all__ = ["DEFAULT_AUDIENCE", "SECRET_ENV", "Claims", "RevokedTokens", "TokenVerifier",
           "issue_token", "secret_from_env", "verify_token"]

SECRET_ENV = "FLASHNPC_SECRET"
MIN_SECRET_BYTES = 32
DEFAULT_AUDIENCE = "flashnpc"

_SHAPE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")


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
                now: float | None = None, audience: str = DEFAULT_AUDIENCE,
                not_before: float | None = None) -> str:
    """An HS256 JWT for ``player_id`` expiring ``ttl_s`` seconds from ``now`` (default: now),
    with a random ``jti`` so that two tokens are never the same text (revocation)."""
    _check_secret(secret)
    if not isinstance(player_id, str) or not 0 < len(player_id) <= MAX_ID_LEN:
        raise ValueError(f"player_id must be a string of 1..{MAX_ID_LEN} characters")
    t = time.time() if now is None else now
    claims: dict[str, Any] = {"sub": player_id, "aud": audience, "iat": int(t),
                              "exp": int(t + ttl_s), "jti": secrets.token_hex(8)}
    if not_before is not None:
        claims["nbf"] = int(not_before)
    return jwt.encode(claims, secret, algorithm="HS256")


@dataclass(frozen=True)
class Claims:
    """What the servers use of an accepted token: the player id, its expiry (Unix seconds)
    and ``key``, an id of the token (revocation)."""

    sub: str
    exp: float
    key: bytes


def _numeric_date(payload: dict[str, Any], name: str) -> float | None:
    v = payload.get(name)
    if v is None:
        return None
    if type(v) not in (int, float) or not math.isfinite(v):
        raise ProtocolError("auth_failed", f"token claim '{name}' must be a number of seconds")
    return float(v)


class TokenVerifier:
    """Checks tokens for one server (see the module docstring). ``public_key``: PEM text of an
    RSA, EC P-256 or Ed25519 public key (needs the ``cryptography`` package)."""

    def __init__(self, secret: bytes, *, public_key: str | bytes | None = None,
                 audience: str = DEFAULT_AUDIENCE, leeway_s: float = 0.0) -> None:
        _check_secret(secret)
        self.secret = secret
        self.audience = audience
        self.leeway_s = leeway_s
        self._keys: dict[str, Any] = {"HS256": secret}
        if public_key is not None:
            alg, key = _load_public_key(public_key)
            self._keys[alg] = key

    @property
    def algorithms(self) -> list[str]:
        return sorted(self._keys)

    def verify(self, token: str, *, now: float | None = None) -> Claims:
        """The token's :class:`Claims`; ProtocolError ``auth_failed`` (malformed, bad
        signature, wrong algorithm or audience, not yet valid) or ``token_expired``."""
        if type(token) is not str or not _SHAPE.fullmatch(token):
            raise ProtocolError("auth_failed", "token is not a JWT (three base64url segments)")
        try:
            alg = jwt.get_unverified_header(token).get("alg")
            key = self._keys.get(alg) if type(alg) is str else None
            if key is None:
                raise ProtocolError("auth_failed", f"token algorithm {str(alg)[:20]!r} is not "
                                    f"accepted (accepted: {', '.join(self.algorithms)})")
            payload = jwt.decode(token, key, algorithms=[alg], audience=self.audience,
                                 options={"require": ["sub", "exp", "aud"], "verify_exp": False,
                                          "verify_nbf": False, "verify_iat": False})
        except ProtocolError:
            raise
        except jwt.InvalidAudienceError:
            raise ProtocolError("auth_failed", f"token audience is not {self.audience!r}") from None
        except jwt.InvalidSignatureError:
            raise ProtocolError("auth_failed", "token signature does not match") from None
        except jwt.MissingRequiredClaimError as exc:
            raise ProtocolError("auth_failed", f"token has no '{exc.claim}' claim") from None
        except (jwt.PyJWTError, ValueError, TypeError, KeyError):
            raise ProtocolError("auth_failed", "token is malformed") from None
        return self._claims(token, payload, time.time() if now is None else now)

    def _claims(self, token: str, payload: dict[str, Any], now: float) -> Claims:
        sub = payload["sub"]
        if type(sub) is not str or not 0 < len(sub) <= MAX_ID_LEN or not _unicode(sub):
            raise ProtocolError("auth_failed", f"token 'sub' must be a player id of "
                                               f"1..{MAX_ID_LEN} characters")
        exp = _numeric_date(payload, "exp")
        nbf = _numeric_date(payload, "nbf")
        assert exp is not None
        if now >= exp + self.leeway_s:
            raise ProtocolError("token_expired", f"token expired at {exp:.0f}")
        if nbf is not None and now < nbf - self.leeway_s:
            raise ProtocolError("auth_failed", f"token not valid before {nbf:.0f}")
        signing_input = token.rpartition(".")[0]
        return Claims(sub, exp, hashlib.sha256(signing_input.encode("ascii")).digest()[:16])


def verify_token(secret: bytes, token: str, *, now: float | None = None,
                 audience: str = DEFAULT_AUDIENCE) -> str:
    """The player id of an HS256 ``token`` (see :class:`TokenVerifier`)."""
    return TokenVerifier(secret, audience=audience).verify(token, now=now).sub


def _unicode(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _load_public_key(pem: str | bytes) -> tuple[str, Any]:
    try:
        from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
        from cryptography.hazmat.primitives.serialization import load_pem_public_key
    except ImportError:
        raise ValueError("a public key for tokens needs the cryptography package "
                         "(pip install 'flashnpc[sign]')") from None
    data = pem.encode() if isinstance(pem, str) else pem
    try:
        key = load_pem_public_key(data)
    except ValueError as exc:
        raise ValueError(f"token public key is not a PEM public key: {exc}") from None
    # the key's type decides the one algorithm accepted with it
    if isinstance(key, rsa.RSAPublicKey):
        return "RS256", key
    if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        return "ES256", key
    if isinstance(key, ed25519.Ed25519PublicKey):
        return "EdDSA", key
    raise ValueError(f"token public key must be RSA, EC P-256 or Ed25519, got "
                     f"{type(key).__name__}")


class RevokedTokens:
    """Tokens ended with ``bye``, remembered (by :attr:`Claims.key`) until they expire, so a
    token cannot be used again after its player left."""

    def __init__(self) -> None:
        self._until: dict[bytes, float] = {}
        self._heap: list[tuple[float, bytes]] = []

    def __len__(self) -> int:
        return len(self._until)

    def __contains__(self, key: object) -> bool:
        return key in self._until

    def revoke(self, claims: Claims, now: float) -> None:
        """Refuse ``claims``' token from now until it expires; forget expired ones."""
        while self._heap and self._heap[0][0] <= now:
            _, key = heapq.heappop(self._heap)
            self._until.pop(key, None)
        if claims.exp > now and claims.key not in self._until:
            self._until[claims.key] = claims.exp
            heapq.heappush(self._heap, (claims.exp, claims.key))
