"""A small n-gram state classifier used by the evaluation.

It is trained only on the training split of the line book and labels a line with the behavior
state it sounds like. Multinomial logistic regression over word 1- and 2-grams, in numpy
(sparse rows as index arrays; no scipy, no sklearn).
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_WORD = re.compile(r"\{\w+\}|[a-z']+|[0-9]+|[^\sa-z0-9']")


def ngrams(text: str) -> list[str]:
    """Word unigrams and bigrams of a lower-cased line, with sentence boundary markers."""
    words = ["<s>", *_WORD.findall(text.lower()), "</s>"]
    return words[1:-1] + [f"{a} {b}" for a, b in itertools.pairwise(words)]


@dataclass
class StateClassifier:
    """Softmax regression from n-gram counts to a state label."""

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
        epochs: int = 8,
        batch_size: int = 256,
        lr: float = 0.5,
        l2: float = 1e-6,
        seed: int = 0,
    ) -> StateClassifier:
        counts = Counter(g for t in texts for g in set(ngrams(t)))
        vocab = {g: i for i, g in enumerate(sorted(g for g, c in counts.items() if c >= min_count))}
        label_names = sorted(set(labels))
        y = np.array([label_names.index(label) for label in labels], dtype=np.int64)
        rows = [cls._features(vocab, t) for t in texts]
        n_feat = len(vocab) + 1
        w = np.zeros((n_feat, len(label_names)), dtype=np.float64)
        rng = np.random.default_rng(seed)
        for _ in range(epochs):
            order = rng.permutation(len(rows))
            for start in range(0, len(order), batch_size):
                idx = order[start : start + batch_size]
                feats, owner = _flatten([rows[i] for i in idx])
                logits = np.zeros((len(idx), w.shape[1]))
                np.add.at(logits, owner, w[feats])
                probs = _softmax(logits)
                probs[np.arange(len(idx)), y[idx]] -= 1.0
                grad = np.zeros_like(w)
                np.add.at(grad, feats, probs[owner])
                w -= lr * (grad / len(idx) + l2 * w)
        return cls(label_names, vocab, w)

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
    def load(cls, path: str | Path) -> StateClassifier:
        data = np.load(path)
        return cls(json.loads(str(data["labels"])), json.loads(str(data["vocab"])), data["weights"])


def _flatten(rows: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    return np.concatenate(rows), np.repeat(np.arange(len(rows)), lengths)


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)
