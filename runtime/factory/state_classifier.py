"""A small n-gram line classifier used by the evaluation, for any label.

The evaluation trains one per label (behavior state, archetype, player intent), only on the
training split of the line book, and asks which label a line sounds like. Multinomial logistic
regression over word 1- and 2-grams, in numpy (sparse rows as index arrays; no scipy, no
sklearn). :meth:`NgramClassifier.fit_many` trains several labels over one feature extraction.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_WORD = re.compile(r"\{\w+\}|[a-z']+|[0-9]+|[^\sa-z0-9']")


def ngrams(text: str) -> list[str]:
    """Word unigrams and bigrams of a lower-cased line, with sentence boundary markers."""
    words = ["<s>", *_WORD.findall(text.lower()), "</s>"]
    return words[1:-1] + [f"{a} {b}" for a, b in itertools.pairwise(words)]


@dataclass
class NgramClassifier:
    """Softmax regression from n-gram counts to a label (a state, an archetype, an intent...)."""

    labels: list[str]
    vocab: dict[str, int]
    weights: np.ndarray  # [n_features + 1 (bias), n_labels]

    @classmethod
    def fit(
        cls,
        texts: Sequence[str],
        labels: Sequence[str],
        *,
        min_count: int = 2,
        seed: int = 0,
        **sgd: Any,
    ) -> NgramClassifier:
        """Train on ``texts`` and their ``labels``; ``sgd``: ``epochs``, ``batch_size``, ``lr``, ``l2``."""
        return cls.fit_many(texts, {"label": labels}, min_count=min_count, seed=seed, **sgd)["label"]

    @classmethod
    def fit_many(
        cls,
        texts: Sequence[str],
        labelings: Mapping[str, Sequence[str]],
        *,
        min_count: int = 2,
        seed: int = 0,
        **sgd: Any,
    ) -> dict[str, NgramClassifier]:
        """One classifier per labeling of the same ``texts`` (the n-grams are extracted once)."""
        counts = Counter(g for t in texts for g in set(ngrams(t)))
        vocab = {g: i for i, g in enumerate(sorted(g for g, c in counts.items() if c >= min_count))}
        rows = [cls._features(vocab, t) for t in texts]
        out = {}
        for name, labels in labelings.items():
            label_names = sorted(set(labels))
            index = {label: i for i, label in enumerate(label_names)}
            y = np.array([index[label] for label in labels], dtype=np.int64)
            out[name] = cls(label_names, vocab, _sgd(rows, y, len(vocab) + 1, len(label_names), seed, **sgd))
        return out

    @staticmethod
    def _features(vocab: dict[str, int], text: str) -> np.ndarray:
        bias = len(vocab)
        return np.array([vocab[g] for g in ngrams(text) if g in vocab] + [bias], dtype=np.int64)

    def predict_proba(self, texts: Sequence[str]) -> np.ndarray:
        feats, owner = _flatten([self._features(self.vocab, t) for t in texts])
        logits = np.zeros((len(texts), len(self.labels)))
        np.add.at(logits, owner, self.weights[feats])
        return _softmax(logits)

    def predict(self, texts: Sequence[str]) -> list[str]:
        if not texts:
            return []
        return [self.labels[i] for i in self.predict_proba(texts).argmax(axis=1)]

    def accuracy(self, texts: Sequence[str], labels: Sequence[str]) -> float:
        predicted = self.predict(texts)
        return float(np.mean([p == t for p, t in zip(predicted, labels)])) if labels else 0.0

    def save(self, path: str | Path) -> None:
        np.savez_compressed(
            path, weights=self.weights, labels=np.array(json.dumps(self.labels)),
            vocab=np.array(json.dumps(self.vocab)),
        )

    @classmethod
    def load(cls, path: str | Path) -> NgramClassifier:
        data = np.load(path)
        return cls(json.loads(str(data["labels"])), json.loads(str(data["vocab"])), data["weights"])


# the name the class had when it only labelled states
StateClassifier = NgramClassifier


def _sgd(
    rows: Sequence[np.ndarray],
    y: np.ndarray,
    n_feat: int,
    n_labels: int,
    seed: int,
    *,
    epochs: int = 8,
    batch_size: int = 256,
    lr: float = 0.5,
    l2: float = 1e-6,
) -> np.ndarray:
    """Mini-batch gradient descent on the softmax cross-entropy; returns the weights."""
    w = np.zeros((n_feat, n_labels), dtype=np.float64)
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(len(rows))
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            feats, owner = _flatten([rows[i] for i in idx])
            logits = np.zeros((len(idx), n_labels))
            np.add.at(logits, owner, w[feats])
            probs = _softmax(logits)
            probs[np.arange(len(idx)), y[idx]] -= 1.0
            grad = np.zeros_like(w)
            np.add.at(grad, feats, probs[owner])
            w -= lr * (grad / len(idx) + l2 * w)
    return w


def _flatten(rows: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    return np.concatenate(rows), np.repeat(np.arange(len(rows)), lengths)


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)
