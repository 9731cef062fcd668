"""How likely the model finds a written line after a prompt: the scorer that chooses, among a
studio's lines for the player's move in near states, the one that fits the NPC's state.

A line written for (archetype, *near state*, intent) answers the move in the archetype's voice,
but may say its own state ("Take cover!" is a combat line). The fine-tuned model has read the
studio's lines for every state, so it can tell: :func:`state_fit` is the mean log-probability of
the line's tokens under the request's prompt less that under the same prompt with the line's own
state. A line that fits the asked state as well as its own scores near 0; one tied to its own
state scores below.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np


def mean_logprobs(model: Any, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> np.ndarray:
    """For each (prompt ids, line ids), the mean log-probability the model gives the line's
    tokens after the prompt, teacher-forced: one right-padded batch (a causal model's earlier
    positions never see the padding)."""
    if not pairs:
        return np.zeros(0)
    seqs = [[*p, *ln] for p, ln in pairs]
    width = max(len(s) for s in seqs)
    ids = np.zeros((len(seqs), width), dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
    logits, _, _ = model.step(ids, None)
    logits = logits.astype(np.float64)
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    out = np.empty(len(pairs))
    for i, (p, ln) in enumerate(pairs):
        at = np.arange(len(p) - 1, len(p) + len(ln) - 1)
        out[i] = float(np.mean(logits[i, at, np.asarray(ln)] - logz[i, at]))
    return out


class FitCache:
    """Mean log-probabilities by (prompt, line), least recently used dropped first. Thread-safe."""

    def __init__(self, size: int = 8192) -> None:
        self.size = size
        self._scores: OrderedDict[tuple[tuple[int, ...], tuple[int, ...]], float] = OrderedDict()
        self._lock = threading.Lock()

    def scores(self, model: Any, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> np.ndarray:
        keys = [(tuple(p), tuple(ln)) for p, ln in pairs]
        with self._lock:
            known = {k: self._scores[k] for k in keys if k in self._scores}
            for k in known:
                self._scores.move_to_end(k)
        todo = list(dict.fromkeys(k for k in keys if k not in known))
        if todo:
            fresh = mean_logprobs(model, todo)
            with self._lock:
                for k, v in zip(todo, fresh):
                    self._scores[k] = float(v)
                    known[k] = float(v)
                while len(self._scores) > self.size:
                    self._scores.popitem(last=False)
        return np.asarray([known[k] for k in keys])


def state_fit(model: Any, cache: FitCache, asked: Sequence[int], own: Sequence[Sequence[int]],
              lines: Sequence[Sequence[int]]) -> np.ndarray:
    """Per line: mean log-probability after the ``asked`` prompt less that after its ``own``
    prompt (the same request with the line's own state)."""
    scores = cache.scores(model, [*((asked, ln) for ln in lines), *zip(own, lines)])
    return scores[: len(lines)] - scores[len(lines):]


__all__ = ["FitCache", "mean_logprobs", "state_fit"]
