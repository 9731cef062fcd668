"""Reference lines: a replay must agree with its reference token for token, except where the two
tokens it parts on are a near tie in the replaying model's logits (another build's rounding)."""

from __future__ import annotations

import copy

import pytest

from mobile_export.reference import compare_cases, generate_cases, reference_settings
from runtime.client.onnx_model import FlashOnnx
from runtime.paths import DEFAULT_MODEL_DIR


@pytest.fixture(scope="module")
def model() -> FlashOnnx:
    return FlashOnnx.load(DEFAULT_MODEL_DIR)


@pytest.fixture(scope="module")
def cases(model: FlashOnnx) -> list[dict]:
    return generate_cases(model, {**reference_settings(), "max_tokens": 8})[:3]


def _parted(cases: list[dict]) -> list[dict]:
    """The cases with the first one's fourth token swapped for another (the replay taking a
    different token there)."""
    got = copy.deepcopy(cases)
    ids = got[0]["ids"]
    ids[3] = (ids[3] + 1) % 1000 + 100
    return got


def test_a_replay_that_matches_has_no_problem(model, cases):
    assert compare_cases(cases, copy.deepcopy(cases), model=model) == []


def test_a_replay_parting_where_the_logits_are_far_apart_is_a_mismatch(model, cases):
    ties: list[str] = []
    problems = compare_cases(cases, _parted(cases), model=model, tolerance=0.0, ties=ties)
    assert len(problems) == 1 and "tokens differ from position 3" in problems[0] and ties == []
    assert compare_cases(cases, _parted(cases)) == problems  # without the model: exact match only


def test_a_replay_parting_at_a_near_tie_is_named_not_refused(model, cases):
    ties: list[str] = []
    assert compare_cases(cases, _parted(cases), model=model, tolerance=1e9, ties=ties) == []
    assert ties == [f"{cases[0]['archetype']}/{cases[0]['state']} from position 3"]
