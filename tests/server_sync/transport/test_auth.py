"""JWT auth tokens: who they name, the algorithms and claims checked, every way they are refused."""

import base64
import hashlib
import hmac
import json

import jwt
import pytest

from server_sync.transport.auth import (
    Claims,
    RevokedTokens,
    TokenVerifier,
    issue_token,
    secret_from_env,
    verify_token,
)
from server_sync.transport.wire import ProtocolError

SECRET = b"s" * 32


def refused(verifier, token, code="auth_failed", now=1000):
    with pytest.raises(ProtocolError) as err:
        verifier.verify(token, now=now)
    assert err.value.code == code
    return err.value.reason


def test_a_token_names_its_player_until_it_expires():
    token = issue_token(SECRET, "alice", ttl_s=60, now=1000)
    assert jwt.get_unverified_header(token)["alg"] == "HS256"
    assert verify_token(SECRET, token, now=1059) == "alice"
    assert "expired" in refused(TokenVerifier(SECRET), token, "token_expired", now=1060)


@pytest.mark.parametrize("mangle", [
    lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"),   # signature changed
    lambda t: t.replace(".", ""),
    lambda t: t + "=",                                             # padding: not base64url
    lambda t: "",
])
def test_tampered_or_malformed_tokens_fail_auth(mangle):
    refused(TokenVerifier(SECRET), mangle(issue_token(SECRET, "alice", now=1000)))


def test_a_token_signed_with_another_secret_fails_auth():
    token = issue_token(b"o" * 32, "alice", now=1000)
    assert "signature" in refused(TokenVerifier(SECRET), token)


def test_a_non_ascii_signature_is_refused_not_a_type_error():
    head, body, _ = issue_token(SECRET, "alice", now=1000).split(".")
    for sig in ("é" * 43, "\ud800", "ÿ"):
        assert "JWT" in refused(TokenVerifier(SECRET), f"{head}.{body}.{sig}")


def _sign(claims, key=SECRET, algorithm="HS256", headers=None):
    return jwt.encode(claims, key, algorithm=algorithm, headers=headers)


@pytest.mark.parametrize(("claims", "needle"), [
    ({"aud": "flashnpc", "exp": 2000}, "'sub'"),
    ({"sub": "a", "aud": "flashnpc"}, "'exp'"),
    ({"sub": "a", "exp": 2000}, "'aud'"),
    ({"sub": "a", "exp": 2000, "aud": "someone-else"}, "audience"),
    ({"sub": "x" * 65, "exp": 2000, "aud": "flashnpc"}, "1..64 characters"),
    ({"sub": "", "exp": 2000, "aud": "flashnpc"}, "1..64 characters"),
    ({"sub": 7, "exp": 2000, "aud": "flashnpc"}, "malformed"),
    ({"sub": "a", "exp": 2000, "aud": "flashnpc", "nbf": 1500}, "not valid before"),
])
def test_claims_sub_exp_aud_and_nbf_are_checked(claims, needle):
    assert needle in refused(TokenVerifier(SECRET), _sign(claims))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _hs256_by_hand(payload: bytes, key: bytes) -> str:
    """An HS256 token built without PyJWT (which refuses some of what an attacker sends)."""
    header = _b64(b'{"alg":"HS256","typ":"JWT"}')
    signing_input = f"{header}.{_b64(payload)}"
    return f"{signing_input}.{_b64(hmac.new(key, signing_input.encode(), hashlib.sha256).digest())}"


def test_a_lone_surrogate_in_sub_is_refused():
    token = _hs256_by_hand(b'{"sub":"\\ud800","exp":2000,"aud":"flashnpc"}', SECRET)
    assert "1..64" in refused(TokenVerifier(SECRET), token)


def test_the_audience_is_configurable():
    token = issue_token(SECRET, "alice", now=1000, audience="my-game")
    assert TokenVerifier(SECRET, audience="my-game").verify(token, now=1000).sub == "alice"
    refused(TokenVerifier(SECRET), token)


def test_alg_none_and_unconfigured_algorithms_are_refused():
    unsigned = jwt.encode({"sub": "a", "exp": 2000, "aud": "flashnpc"}, None, algorithm="none")
    refused(TokenVerifier(SECRET), unsigned + "x")  # a 'none' token has an empty signature
    hs512 = _sign({"sub": "a", "exp": 2000, "aud": "flashnpc"}, SECRET * 2, algorithm="HS512")
    assert "HS512" in refused(TokenVerifier(SECRET), hs512)


def _keypair(kind):
    pytest.importorskip("cryptography")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    private = {"RS256": lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
               "ES256": lambda: ec.generate_private_key(ec.SECP256R1()),
               "EdDSA": ed25519.Ed25519PrivateKey.generate}[kind]()
    public = private.public_key().public_bytes(serialization.Encoding.PEM,
                                              serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public.decode()


@pytest.mark.parametrize("alg", ["RS256", "ES256", "EdDSA"])
def test_a_backend_signs_with_its_private_key_and_the_server_checks_the_public_key(alg):
    private, public = _keypair(alg)
    verifier = TokenVerifier(SECRET, public_key=public)
    assert verifier.algorithms == sorted(["HS256", alg])
    token = _sign({"sub": "bob", "exp": 2000, "aud": "flashnpc"}, private, alg)
    assert verifier.verify(token, now=1000).sub == "bob"
    assert TokenVerifier(SECRET).algorithms == ["HS256"]
    assert alg in refused(TokenVerifier(SECRET), token)  # no key configured: not accepted
    other, _ = _keypair(alg)
    assert "signature" in refused(verifier, _sign({"sub": "bob", "exp": 2000, "aud": "flashnpc"},
                                                  other, alg))


def test_an_hmac_token_keyed_with_the_public_key_text_is_refused():
    """The classic algorithm confusion: HS256 signed with the (public) key text."""
    _, public = _keypair("RS256")
    forged = _hs256_by_hand(b'{"sub":"eve","exp":2000,"aud":"flashnpc"}', public.encode())
    assert "signature" in refused(TokenVerifier(SECRET, public_key=public), forged)


def test_a_bad_public_key_is_a_clear_value_error():
    with pytest.raises(ValueError, match="PEM public key"):
        TokenVerifier(SECRET, public_key="not a key")


def test_revoked_tokens_are_remembered_until_they_expire():
    revoked = RevokedTokens()
    claims = Claims("a", 2000.0, b"k" * 16)
    revoked.revoke(claims, now=1000)
    assert claims.key in revoked
    revoked.revoke(Claims("b", 3000.0, b"j" * 16), now=2500)  # prunes the expired one
    assert claims.key not in revoked and len(revoked) == 1


def test_the_same_claims_give_the_same_revocation_key_whatever_the_signature_text():
    token = issue_token(SECRET, "alice", now=1000)
    key = TokenVerifier(SECRET).verify(token, now=1000).key
    assert key == TokenVerifier(SECRET).verify(token, now=1001).key
    assert json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))["sub"] == "alice"


def test_short_or_missing_secrets_are_refused():
    with pytest.raises(ValueError, match="at least 32 bytes"):
        issue_token(b"short", "alice")
    with pytest.raises(ValueError, match="FLASHNPC_SECRET"):
        secret_from_env({})
    with pytest.raises(ValueError, match="FLASHNPC_SECRET"):
        secret_from_env({"FLASHNPC_SECRET": "x" * 16})
    assert secret_from_env({"FLASHNPC_SECRET": "x" * 32}) == b"x" * 32
