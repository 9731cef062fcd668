"""runtime.client.sampling: greedy, temperature, top-k, top-p, seeded reproducibility."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.client.sampling import filtered_probs, sample_next

LOGITS = np.array([1.0, 3.0, 2.0, 0.5, 3.0, -1.0])


def test_temperature_zero_is_greedy_and_takes_the_lowest_id_on_ties():
    assert sample_next(LOGITS, None, temperature=0) == 1


def test_top_k_one_and_tiny_top_p_reduce_to_the_most_likely_token():
    rng = np.random.default_rng(0)
    logits = np.array([0.1, 2.0, 1.0])
    assert {sample_next(logits, rng, temperature=1.0, top_k=1, top_p=1.0) for _ in range(50)} == {1}
    assert {sample_next(logits, rng, temperature=1.0, top_p=1e-6) for _ in range(50)} == {1}


def test_filtered_probs_apply_temperature_top_k_and_top_p():
    p = filtered_probs(LOGITS, temperature=1.0)
    expected = np.exp(LOGITS - LOGITS.max()) / np.exp(LOGITS - LOGITS.max()).sum()
    assert np.allclose(p, expected)
    top3 = filtered_probs(LOGITS, temperature=1.0, top_k=3)
    assert set(np.flatnonzero(top3)) == {1, 2, 4} and np.isclose(top3.sum(), 1)
    # ids 1 and 4 hold ~0.73 of the mass: top_p 0.7 keeps exactly those two
    nucleus = filtered_probs(LOGITS, temperature=1.0, top_p=0.7)
    assert set(np.flatnonzero(nucleus)) == {1, 4}
    sharp = filtered_probs(LOGITS, temperature=0.1)
    assert sharp[[1, 4]].sum() > 0.999


def test_seeded_draws_repeat_and_follow_the_filtered_distribution():
    draws = [sample_next(LOGITS, np.random.default_rng(3), temperature=1.0, top_p=1.0) for _ in range(3)]
    assert len(set(draws)) == 1
    rng = np.random.default_rng(0)
    n = 4000
    counts = np.bincount([sample_next(LOGITS, rng, temperature=1.0, top_k=4, top_p=1.0)
                          for _ in range(n)], minlength=LOGITS.size)
    expected = filtered_probs(LOGITS, temperature=1.0, top_k=4) * n
    assert counts[[3, 5]].sum() == 0  # outside the top 4
    assert np.abs(counts - expected).max() < 5 * np.sqrt(expected.max())


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"temperature": -1.0}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": 1.5}, "top_k"),
])
def test_bad_parameters_are_rejected(kwargs: dict, message: str):
    with pytest.raises(ValueError, match=message):
        sample_next(LOGITS, np.random.default_rng(0), **kwargs)


def test_sampling_without_rng_is_an_error():
    with pytest.raises(ValueError, match="needs an rng"):
        sample_next(LOGITS, None, temperature=1.0)
