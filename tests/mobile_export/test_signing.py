"""Signed bundles: keygen, sign, and a game that sets a public key loads only what it signed."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from mobile_export.signing import SigningError, generate_key, sign_bundle
from mobile_export.verify import verify_bundle
from plugin.cli import main
from runtime.client.bundle import BundleError, open_bundle
from runtime.client.generator import LineGenerator
from runtime.client.signature import SIGNATURE, raw_public_key


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Path]:
    home = tmp_path_factory.mktemp("keys")
    ours, ours_pub = generate_key(home / "studio.key")
    theirs, theirs_pub = generate_key(home / "other.key")
    return ours, ours_pub, theirs, theirs_pub


@pytest.fixture
def signed_zip(bundle_zip, keys, tmp_path) -> Path:
    path = tmp_path / "signed.zip"
    shutil.copyfile(bundle_zip.path, path)
    sign_bundle(path, keys[0])
    return path


def test_a_signed_zip_loads_with_its_public_key_in_every_form(signed_zip, keys):
    pem = keys[1]
    raw = raw_public_key(pem)
    for key in (pem, pem.read_text(), raw, raw.hex()):
        gen = LineGenerator.load(signed_zip, public_key=key, warmup=False)
        assert gen.generate("guard", "alert", intent="greet", seed=3).text
        gen.close()


def test_a_signed_directory_bundle_loads_with_its_key(bundle_dir, keys, tmp_path):
    root = tmp_path / "dir"
    shutil.copytree(bundle_dir.path, root)
    sign_bundle(root, keys[0])
    assert (root / SIGNATURE).is_file()
    assert open_bundle(root, public_key=keys[1]).manifest["format"] == "flashnpc-bundle"


def test_a_game_with_a_key_refuses_an_unsigned_bundle(bundle_zip, keys):
    with pytest.raises(BundleError, match=r"unsigned \(no manifest\.sig\)"):
        LineGenerator.load(bundle_zip.path, public_key=keys[1], warmup=False)


def test_a_game_with_a_key_refuses_a_bundle_signed_by_another_key(bundle_zip, keys, tmp_path):
    other = tmp_path / "other.zip"
    shutil.copyfile(bundle_zip.path, other)
    sign_bundle(other, keys[2])
    with pytest.raises(BundleError, match=r"the signature does not match manifest\.json"):
        LineGenerator.load(other, public_key=keys[1], warmup=False)


def test_a_manifest_changed_after_signing_is_refused(signed_zip, keys, tmp_path):
    with zipfile.ZipFile(signed_zip) as zf:
        entries = [(i.filename, zf.read(i)) for i in zf.infolist()]
    forged = tmp_path / "forged.zip"
    with zipfile.ZipFile(forged, "w") as zf:
        for name, data in entries:
            if name == "manifest.json":
                m = json.loads(data)
                m["sampling"]["temperature"] = 2.0
                data = json.dumps(m).encode()
            zf.writestr(name, data)
    with pytest.raises(BundleError, match="signature does not match"):
        LineGenerator.load(forged, public_key=keys[1], warmup=False)
    # without a key the (still self-consistent) bundle loads as before
    LineGenerator.load(forged, warmup=False).close()


def test_a_game_with_a_key_refuses_a_model_directory(model_dir, keys):
    with pytest.raises(BundleError, match="only a signed bundle loads"):
        LineGenerator.load(model_dir, public_key=keys[1], warmup=False)


def test_a_game_without_a_key_loads_signed_and_unsigned_bundles(signed_zip, bundle_zip):
    for path in (signed_zip, bundle_zip.path):
        LineGenerator.load(path, warmup=False).close()


@pytest.mark.parametrize(("key", "message"), [
    (b"short", "expected 32 raw bytes, 64 hex digits or a PEM"),
    ("zz" * 32, "expected 32 raw bytes"),
    ("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", "not a readable PEM key"),
])
def test_a_malformed_public_key_is_a_clear_error(bundle_zip, key, message):
    with pytest.raises(BundleError, match=message):
        LineGenerator.load(bundle_zip.path, public_key=key, warmup=False)


def test_sign_refuses_a_bundle_that_does_not_verify_and_a_wrong_key_file(bundle_dir, keys, tmp_path):
    root = tmp_path / "bad"
    shutil.copytree(bundle_dir.path, root)
    (root / "extra.txt").write_text("x")
    with pytest.raises(BundleError, match=r"extra\.txt: not listed"):
        sign_bundle(root, keys[0])
    assert not (root / SIGNATURE).exists()
    with pytest.raises(SigningError, match="not an unencrypted PEM private key"):
        sign_bundle(bundle_dir.path, keys[1])  # the public half


def test_keygen_sign_and_verify_on_the_command_line(bundle_zip, tmp_path, capsys):
    key = tmp_path / "k"
    assert main(["bundle", "keygen", "--out", str(key)]) == 0
    assert key.stat().st_mode & 0o777 == 0o600
    assert main(["bundle", "keygen", "--out", str(key)]) == 2  # no silent overwrite
    assert "already exists" in capsys.readouterr().err
    path = tmp_path / "b.zip"
    shutil.copyfile(bundle_zip.path, path)
    assert main(["bundle", "verify", str(path), "--public-key", f"{key}.pub"]) == 1
    assert "unsigned" in capsys.readouterr().out
    assert main(["bundle", "sign", str(path), "--key", str(key)]) == 0
    capsys.readouterr()
    assert main(["bundle", "verify", str(path), "--public-key", f"{key}.pub", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["checks"][0]["name"] == "signature"
    assert verify_bundle(path, public_key=raw_public_key(Path(f"{key}.pub"))).ok
