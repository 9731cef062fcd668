"""Random walks through a word constraint's states, for tests that compare its readers."""

from __future__ import annotations

import numpy as np

from runtime.client.constraints import WordConstraint, WordState


def random_walk(wc: WordConstraint, eos_id: int, rng: np.random.Generator, steps: int) -> list[WordState]:
    """The states after each of up to ``steps`` tokens drawn uniformly from those ``wc`` allows,
    from a line's start; the walk stops before an ``eos``."""
    states, state = [], WordState()
    for _ in range(steps):
        t = int(rng.choice(np.flatnonzero(~wc.blocked(state))))
        if t == eos_id:
            break
        state = wc.step(state, t)
        states.append(state)
    return states
