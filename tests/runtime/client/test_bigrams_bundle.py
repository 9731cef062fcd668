"""A mobile bundle's constraints.json with the book's word bigrams: loaded and masked with, and
refused with one BundleError naming the file and the field when the table is malformed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mobile_export.bundle import export_bundle
from runtime.client.generator import LineGenerator
from runtime.paths import DEFAULT_MODEL_DIR
from tests.mobile_export.test_tamper import refused, rewritten


@pytest.fixture(scope="module")
def shipped_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_bundle(DEFAULT_MODEL_DIR, tmp_path_factory.mktemp("bundle") / "flash", target="x86",
                         zip_output=True).path


@pytest.fixture(scope="module")
def with_table(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from runtime.factory.export import write_constraints

    path = tmp_path_factory.mktemp("bigram_bundle") / "constraints.json"
    write_constraints(path, bigrams=True)
    return json.loads(path.read_text(encoding="utf-8"))


def test_a_bundle_whose_constraints_carry_the_table_loads_and_masks_with_it(shipped_zip, with_table, tmp_path):
    forged = rewritten(shipped_zip, tmp_path, lambda files: files.update(
        {"constraints.json": json.dumps(with_table).encode()}))
    gen = LineGenerator.load(forged, warmup=False)
    assert gen.mask._bigrams is not None and gen.mask._bigrams.table.pairs()
    assert gen.generate("guard", "idle", seed=1).text
    assert LineGenerator.load(shipped_zip, warmup=False).mask._bigrams is not None  # shipped with them


@pytest.mark.parametrize(("change", "reason"), [
    ({"offsets": [0]}, "bigrams.offsets must hold"),
    ({"next": [-1]}, "bigrams.next: ids must be in"),
    ({"slots": ["horse"]}, "bigrams.slots must list"),
])
def test_a_bundle_with_a_malformed_table_is_refused_naming_the_file_and_the_field(shipped_zip, with_table, tmp_path,
                                                                                  change, reason):
    doc = {**with_table, "bigrams": {**with_table["bigrams"], **change}}
    forged = rewritten(shipped_zip, tmp_path, lambda files: files.update({"constraints.json": json.dumps(doc).encode()}))
    refused(forged, "constraints.json", reason)
