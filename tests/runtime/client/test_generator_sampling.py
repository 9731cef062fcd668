"""runtime.client.sampling's partial-sort fast path equals a full stable sort (the definition), draw for draw."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.client.sampling import filtered_probs, sample_next


def reference_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The definition: sort everything (most likely first, lowest id first on ties), cut, renormalise."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    order = np.argsort(-z, kind="stable")
    if 0 < top_k < z.size:
        order = order[:top_k]
    p = np.exp(z[order] - z[order[0]])
    p /= p.sum()
    if top_p < 1:
        n_keep = max(1, int(np.count_nonzero(np.cumsum(p) - p < top_p)))
        order, p = order[:n_keep], p[:n_keep] / p[:n_keep].sum()
    out = np.zeros(z.size)
    out[order] = p
    return out


def rows(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for v in (1, 7, 512, 2048):
        peaked = rng.standard_normal(v) * 4
        ties = np.round(rng.standard_normal(v) * 2)
        masked = rng.standard_normal(v)
        masked[rng.random(v) < 0.5] = -np.inf
        masked[0] = 0.5
        out += [peaked, ties, masked, np.zeros(v)]
    return [r.astype(np.float32) for r in out]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [
    (1.0, 0, 1.0), (0.8, 0, 0.95), (1.3, 0, 0.5), (0.7, 40, 0.9), (1.0, 3, 1.0), (1.0, 1, 0.95), (0.5, 0, 1e-6),
])
def test_fast_filtered_probs_keep_the_same_tokens_as_a_full_sort(seed, temperature, top_k, top_p):
    for i, row in enumerate(rows(seed)):
        got = filtered_probs(row, temperature=temperature, top_k=top_k, top_p=top_p)
        want = reference_probs(row, temperature, top_k, top_p)
        assert np.array_equal(got > 0, want > 0), i
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
        a = sample_next(row, np.random.default_rng(i), temperature=temperature, top_k=top_k, top_p=top_p)
        cdf = np.cumsum(want)
        u = np.random.default_rng(i).random()
        b = min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), row.size - 1)
        while want[b] == 0:
            b -= 1
        assert a == b
