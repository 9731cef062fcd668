"""Batched sampling of many prompts through one exported Flash graph.

Prompts are grouped by length, so a batch never holds padding: every row of a group prefills the
same number of tokens and then decodes in lock step (:func:`runtime.client.onnx_model.decode_rows`)
until all rows have emitted ``eos`` or ``max_tokens`` is reached; finished rows leave the batch.
Each row samples with its own seeded generator, so a row's tokens do not depend on which other
rows share its batch. With ``words`` (a :class:`runtime.client.constraints.WordConstraint`) every row is
masked as :class:`runtime.client.generator.LineGenerator` masks it: the same per-state masks, the last
token of the budget ending the word, the voice bonus, and a row whose every token is blocked, or whose most
likely token is blocked and holds more than half the probability (:func:`runtime.client.constraints.vetoed`,
never inside an ellipsis), stops there — one implementation, :meth:`WordConstraint.masked_row`; ``stopped`` reports which rows did, so a caller can draw them again as the engine
does.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from runtime.client.constraints import WordConstraint, WordState
from runtime.client.onnx_model import FlashOnnx, decode_rows
from runtime.client.sampling import DEFAULT_TEMPERATURE, DEFAULT_TOP_P, sample_next


def generate_ids_batch(
    model: FlashOnnx,
    prompts: Sequence[Sequence[int]],
    *,
    seeds: Sequence[int],
    blocked: Sequence[np.ndarray | None] | None = None,
    max_tokens: int = 48,
    temperature: float = DEFAULT_TEMPERATURE,
    top_k: int = 0,
    top_p: float = DEFAULT_TOP_P,
    batch_size: int = 64,
    words: WordConstraint | None = None,
    banned: Sequence[int | None] | None = None,
    stopped: list[bool] | None = None,
) -> list[list[int]]:
    """Sample a continuation for every prompt; returns the generated ids (without ``eos``).

    ``blocked[i]`` (optional) holds token ids prompt ``i`` may never emit: their logits are set
    to -inf before sampling, so constraints hold by construction rather than by filtering.
    ``words`` (optional): the word constraints, applied as the line engine applies them, with
    ``banned[i]`` the tags prompt ``i`` bans (:meth:`WordConstraint.banned_bits`; None or
    omitted: the vocabulary and the static banned words). A row the constraints leave without
    a token ends there (inside a word, its ids then end on an unfinished word), and so does one
    the constraints veto; ``stopped`` (optional, a list as long as ``prompts``) gets True at
    those rows.
    """
    if len(seeds) != len(prompts):
        raise ValueError(f"got {len(prompts)} prompts but {len(seeds)} seeds")
    if blocked is not None and len(blocked) != len(prompts):
        raise ValueError(f"got {len(prompts)} prompts but {len(blocked)} blocked-id sets")
    if banned is not None and len(banned) != len(prompts):
        raise ValueError(f"got {len(prompts)} prompts but {len(banned)} banned-tag sets")
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, prompt in enumerate(prompts):
        by_length[len(prompt)].append(i)
    out: list[list[int]] = [[] for _ in prompts]
    for length in sorted(by_length):
        rows = by_length[length]
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            flags = [False] * len(chunk)
            generated = _generate_group(
                model, [prompts[i] for i in chunk], [seeds[i] for i in chunk], flags,
                [blocked[i] for i in chunk] if blocked is not None else [None] * len(chunk),
                max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, words=words,
                banned=[banned[i] for i in chunk] if banned is not None else [None] * len(chunk),
            )
            for i, ids, flag in zip(chunk, generated, flags):
                out[i] = ids
                if stopped is not None:
                    stopped[i] = flag
    return out


def _generate_group(
    model: FlashOnnx,
    prompts: Sequence[Sequence[int]],
    seeds: Sequence[int],
    stopped: list[bool],
    blocked: Sequence[np.ndarray | None],
    *,
    max_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    words: WordConstraint | None,
    banned: Sequence[int | None],
) -> list[list[int]]:
    eos = model.tokenizer.eos_id
    rngs = [np.random.default_rng(s) for s in seeds]
    result: list[list[int]] = [[] for _ in prompts]
    states = [WordState()] * len(prompts)
    if max_tokens <= 0:
        return result
    logits, past, _ = model.step(np.asarray(prompts, dtype=np.int64), None)

    def pick(r: int, row_logits: np.ndarray) -> tuple[int | None, bool]:
        ids_r = blocked[r]
        if words is not None:  # the client engine's masks, bonus and veto (WordConstraint.masked_row)
            row_logits, veto = words.masked_row(row_logits, states[r], last=len(result[r]) + 1 >= max_tokens,
                                                banned=banned[r], block=ids_r)
            if not np.isfinite(row_logits).any():
                stopped[r] = states[r].mode != 0  # a dead end inside a word; at a boundary it reads as eos
                return None, False
            if veto:
                stopped[r] = True
                return None, False
        elif ids_r is not None and len(ids_r):
            row_logits = row_logits.copy()
            row_logits[ids_r] = -np.inf
        nxt = sample_next(row_logits, rngs[r], temperature=temperature, top_k=top_k, top_p=top_p)
        if nxt == eos:
            return None, False
        result[r].append(nxt)
        if words is not None:
            states[r] = words.step(states[r], nxt)
        return nxt, len(result[r]) < max_tokens

    for _ in decode_rows(model, logits, past, len(prompts), pick):
        pass
    return result
