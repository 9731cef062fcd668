"""The shipped default model (runtime/assets/flash) loads with no argument and does its job.

A fast, seeded slice of `flashnpc eval`: the full evaluation's figures are in docs/model.md.
"""

import json

import pytest

from runtime.evaluate import THRESHOLDS
from runtime.onnx_model import FlashOnnx
from runtime.paths import DEFAULT_MODEL_DIR


@pytest.fixture(scope="module")
def fast_report(shipped_fast_report):
    return shipped_fast_report


def test_shipped_int4_model_fits_the_flash_budget():
    assert (DEFAULT_MODEL_DIR / "model.int4.onnx").stat().st_size <= 8 * 1024 * 1024


def test_shipped_model_loads_without_arguments_and_speaks_in_state():
    model = FlashOnnx.load()
    line = model.generate("guard", "alert", persona=("gruff",), intent="greet", seed=3)
    assert line.strip()
    assert set(model.catalog["states"]) >= {"patrol", "alert", "rest", "combat"}


def test_shipped_model_passes_a_fast_slice_of_the_eval_thresholds(fast_report):
    f = fast_report["figures"]
    assert f["fidelity_seen"] >= THRESHOLDS["fidelity_seen"], f
    assert f["fidelity_heldout"] >= THRESHOLDS["fidelity_heldout"], f
    assert f["distinct2"] >= THRESHOLDS["distinct2"], f
    assert f["novelty"] >= THRESHOLDS["novelty"], f
    assert f["banned_hits"] == 0, fast_report["banned_examples"]
    assert f["slot_violations"] == 0, fast_report["slot_violation_examples"]
    assert f["ppl_int4"] < 4.0, f


def test_recorded_full_evaluation_passed_every_threshold():
    recorded = json.loads((DEFAULT_MODEL_DIR / "eval.json").read_text())
    assert recorded["passed"] and recorded["figures"]["samples"] >= 10_000
    assert all(recorded["checks"].values())
