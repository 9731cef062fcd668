"""HMAC tokens: who they name, and every way they are refused."""

import pytest

from server_sync.transport.auth import issue_token, secret_from_env, verify_token
from server_sync.transport.wire import ProtocolError

SECRET = b"s" * 32


def test_a_token_names_its_player_until_it_expires():
    token = issue_token(SECRET, "alice", ttl_s=60, now=1000)
    assert verify_token(SECRET, token, now=1059) == "alice"
    with pytest.raises(ProtocolError) as err:
        verify_token(SECRET, token, now=1060)
    assert err.value.code == "token_expired"


@pytest.mark.parametrize("mangle", [
    lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"),   # signature changed
    lambda t: "eyJzdWIiOiJtYWxsb3J5IiwiZXhwIjo5OTk5OTk5OTk5fQ" + t[t.index("."):],  # payload swapped
    lambda t: t.replace(".", ""),
    lambda t: "",
])
def test_tampered_or_malformed_tokens_fail_auth(mangle):
    token = issue_token(SECRET, "alice", now=1000)
    with pytest.raises(ProtocolError) as err:
        verify_token(SECRET, mangle(token), now=1000)
    assert err.value.code == "auth_failed"


def test_a_token_signed_with_another_secret_fails_auth():
    token = issue_token(b"o" * 32, "alice", now=1000)
    with pytest.raises(ProtocolError, match="signature"):
        verify_token(SECRET, token, now=1000)


def test_short_or_missing_secrets_are_refused():
    with pytest.raises(ValueError, match="at least 16 bytes"):
        issue_token(b"short", "alice")
    with pytest.raises(ValueError, match="FLASHNPC_SECRET"):
        secret_from_env({})
    assert secret_from_env({"FLASHNPC_SECRET": "x" * 16}) == b"x" * 16
