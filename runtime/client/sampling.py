"""Next-token sampling from a logits row, in numpy, reproducible for a seeded generator.

``sample_next(logits, rng, temperature=..., top_k=..., top_p=...)``:

- ``temperature == 0``: greedy (argmax, the lowest id on ties); ``rng`` is not used.
- otherwise softmax(logits / temperature), then keep the ``top_k`` most likely tokens
  (``top_k <= 0``: all), then the smallest set of most likely tokens whose probability
  sums to at least ``top_p`` (``top_p >= 1``: all; the most likely token is always kept),
  renormalise and draw one token with ``rng``.

The draw uses exactly one ``rng.random()`` per sampled token, so a generator seeded the
same way gives the same tokens for the same logits.
"""

from __future__ import annotations

import numpy as np

#: The engines' default decoding (the client engine, the servers, ``flashnpc eval``), which a
#: bundle's manifest records. Temperature 1.0 since session 9 (was 0.8): read blind against 0.8
#: in one sitting (docs/ratings/ab_t10_t08, 100 prompts each) it rated as well (70.0% / 2.0%
#: against 68.0% / 1.0% shippable / garbled; as served 71.4% / 0.0% against 68.7% / 1.0%), and
#: an NPC asked the same thing 50 times says more different things (distinct-2 0.42-0.46
#: against 0.38-0.42; the book's own for one prompt 0.47-0.52). The word constraints, not a
#: cooler temperature, keep the non-words and glitches out (docs/model.md, "Decoding").
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 0.95


def _check(temperature: float, top_k: int, top_p: float) -> None:
    if not np.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if int(top_k) != top_k:
        raise ValueError(f"top_k must be an int (0 = no limit), got {top_k!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")


def _top_k_ids(z: np.ndarray, k: int) -> np.ndarray:
    """Ids of the ``k`` largest values of ``z``, ties broken towards the lowest id (ascending ids)."""
    n = z.size
    cand = np.argpartition(z, n - k)[n - k :]
    zc = z[cand]
    v = zc.min()  # the k-th largest value
    if np.count_nonzero(z == v) == np.count_nonzero(zc == v):  # no tie straddles the cut
        return np.sort(cand)
    above = np.flatnonzero(z > v)
    return np.union1d(above, np.flatnonzero(z == v)[: k - above.size])


def _kept(logits: np.ndarray, temperature: float, top_k: int, top_p: float
          ) -> tuple[np.ndarray | None, np.ndarray]:
    """(ids in ascending order, or None for all ids; their probabilities) of the filtered
    distribution. Equivalent to sorting the whole row, without sorting it: ``top_k`` is a
    partition, and for ``top_p`` only tokens with probability >= (1 - top_p) / n can be in the
    nucleus (all tokens at most that likely hold < 1 - top_p of the mass together), so only
    those are sorted."""
    row = np.asarray(logits, dtype=np.float64).reshape(-1)
    if row.size == 0 or not np.isfinite(row).any():
        raise ValueError("logits must be a non-empty row with at least one finite value")
    z = row / temperature
    if np.isnan(z).any():
        z = np.where(np.isnan(z), -np.inf, z)
    ids = _top_k_ids(z, int(top_k)) if 0 < top_k < z.size else None
    zk = z if ids is None else z[ids]
    p = np.exp(zk - zk.max())
    p /= p.sum()
    if top_p >= 1.0:
        return ids, p
    cand = np.flatnonzero(p >= (1.0 - top_p) / p.size)
    order = cand[np.argsort(-zk[cand], kind="stable")]  # most likely first, lowest id on ties
    q = p[order]
    # keep tokens until the cumulative probability before them reaches top_p
    cum_before = np.cumsum(q) - q
    n_keep = max(1, int(np.count_nonzero(cum_before < top_p)))
    keep = np.sort(order[:n_keep])
    return (keep if ids is None else ids[keep]), p[keep] / q[:n_keep].sum()


def filtered_probs(logits: np.ndarray, *, temperature: float = 1.0, top_k: int = 0,
                   top_p: float = 1.0) -> np.ndarray:
    """The distribution :func:`sample_next` draws from (float64, sums to 1; zeros outside).

    ``temperature`` must be > 0 here (greedy has no distribution).
    """
    _check(temperature, top_k, top_p)
    if temperature == 0:
        raise ValueError("filtered_probs needs temperature > 0 (temperature 0 is greedy)")
    ids, p = _kept(logits, temperature, top_k, top_p)
    if ids is None:
        return p
    out = np.zeros(np.size(logits), dtype=np.float64)
    out[ids] = p
    return out


def sample_next(logits: np.ndarray, rng: np.random.Generator | None = None, *,
                temperature: float = DEFAULT_TEMPERATURE, top_k: int = 0, top_p: float = DEFAULT_TOP_P) -> int:
    """Pick the next token id from one logits row [V] (see the module docstring)."""
    _check(temperature, top_k, top_p)
    row = np.asarray(logits).reshape(-1)
    if temperature == 0:
        if row.size == 0:
            raise ValueError("logits must be a non-empty row")
        return int(np.argmax(row))
    if rng is None:
        raise ValueError("sampling with temperature > 0 needs an rng (np.random.default_rng(seed))")
    ids, p = _kept(row, temperature, top_k, top_p)
    # the cdf over the kept ids in id order has exactly the partial sums of the cdf over the
    # whole vocabulary at those ids (the others add zeros), so the draw is the same
    cdf = np.cumsum(p)
    idx = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    # searchsorted can land past the last id with probability only through rounding at the
    # very top of the cdf; step back to the last id with probability
    idx = min(idx, p.size - 1)
    while p[idx] == 0:
        idx -= 1
    return idx if ids is None else int(ids[idx])


__all__ = ["DEFAULT_TEMPERATURE", "DEFAULT_TOP_P", "filtered_probs", "sample_next"]
