"""Batched sampling of many prompts through one exported Flash graph.

Prompts are grouped by length, so a batch never holds padding: every row of a group prefills the
same number of tokens and then decodes in lock step (:func:`runtime.onnx_model.decode_rows`)
until all rows have emitted ``eos`` or ``max_tokens`` is reached; finished rows leave the batch.
Each row samples with its own seeded generator, so a row's tokens do not depend on which other
rows share its batch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from runtime.onnx_model import FlashOnnx, decode_rows
from runtime.sampling import sample_next


def generate_ids_batch(
    model: FlashOnnx,
    prompts: Sequence[Sequence[int]],
    *,
    seeds: Sequence[int],
    blocked: Sequence[np.ndarray | None] | None = None,
    max_tokens: int = 32,
    temperature: float = 0.8,
    top_k: int = 0,
    top_p: float = 0.95,
    batch_size: int = 64,
) -> list[list[int]]:
    """Sample a continuation for every prompt; returns the generated ids (without ``eos``).

    ``blocked[i]`` (optional) holds token ids prompt ``i`` may never emit: their logits are set
    to -inf before sampling, so constraints hold by construction rather than by filtering.
    """
    if len(seeds) != len(prompts):
        raise ValueError(f"got {len(prompts)} prompts but {len(seeds)} seeds")
    if blocked is not None and len(blocked) != len(prompts):
        raise ValueError(f"got {len(prompts)} prompts but {len(blocked)} blocked-id sets")
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, prompt in enumerate(prompts):
        by_length[len(prompt)].append(i)
    out: list[list[int]] = [[] for _ in prompts]
    for length in sorted(by_length):
        rows = by_length[length]
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            generated = _generate_group(
                model, [prompts[i] for i in chunk], [seeds[i] for i in chunk],
                [blocked[i] for i in chunk] if blocked is not None else [None] * len(chunk),
                max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
            )
            for i, ids in zip(chunk, generated):
                out[i] = ids
    return out


def _generate_group(
    model: FlashOnnx,
    prompts: Sequence[Sequence[int]],
    seeds: Sequence[int],
    blocked: Sequence[np.ndarray | None],
    *,
    max_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
) -> list[list[int]]:
    eos = model.tokenizer.eos_id
    rngs = [np.random.default_rng(s) for s in seeds]
    result: list[list[int]] = [[] for _ in prompts]
    if max_tokens <= 0:
        return result
    logits, past, _ = model.step(np.asarray(prompts, dtype=np.int64), None)

    def pick(r: int, row_logits: np.ndarray) -> tuple[int | None, bool]:
        ids_r = blocked[r]
        if ids_r is not None and len(ids_r):
            row_logits = row_logits.copy()
            row_logits[ids_r] = -np.inf
        nxt = sample_next(row_logits, rngs[r], temperature=temperature, top_k=top_k, top_p=top_p)
        if nxt == eos:
            return None, False
        result[r].append(nxt)
        return nxt, len(result[r]) < max_tokens

    for _ in decode_rows(model, logits, past, len(prompts), pick):
        pass
    return result
