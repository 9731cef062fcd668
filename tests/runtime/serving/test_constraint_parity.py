"""The server's engines apply the client engine's constraints: the same masks, voice bonus and veto.

Every decode path calls :meth:`runtime.client.constraints.WordConstraint.masked_row`; these tests
check the serving engines feed it what the client engine would (the row's state as ``step``
reads the emitted tokens, the budget's last token, the request's banned tags and blocked ids)
and sample from what it returns: greedy, the batched engine's token is the argmax of the row the
client's own pieces give (``mask_logits`` with the voice bonus, then the request's blocked ids),
so a server-written line obeys the same rules and gets the same bonus.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from runtime.client.constraints import WordConstraint, WordState, read_constraints, vetoed
from runtime.client.onnx_model import DEFAULT_MODEL_DIR
from runtime.serving.batched_engine import BatchedEngine, GenRequest, load_flash


@pytest.fixture(scope="module")
def loaded() -> Any:
    return load_flash(DEFAULT_MODEL_DIR)


def requests(words: WordConstraint, tok: Any, n: int) -> list[GenRequest]:
    cat = tok.catalog
    rng = np.random.default_rng(12)
    out = []
    for j in range(n):
        npc = str(rng.choice(cat["archetypes"]))
        persona = sorted(rng.choice(cat["persona_traits"], size=int(rng.integers(0, 3)), replace=False).tolist())
        ctx = {s: str(rng.choice(cat["context"][s])) for s in rng.choice(list(cat["context"]), size=2, replace=False)}
        ids, _ = tok.encode_prompt(npc, persona, str(rng.choice(cat["states"])), str(rng.choice(cat["intents"])), ctx)
        out.append(GenRequest(ids, seed=j, max_tokens=16, temperature=0.0, top_k=0, top_p=1.0,
                              blocked_tokens=[tok.id_of(f"<slot:{s}>") for s in cat["slots"]],
                              banned=words.banned_bits(npc, persona, ctx)))
    return out


def test_the_batched_engine_samples_from_the_client_engines_masks_and_voice_bonus(loaded: Any,
                                                                                  one_torch_thread: Any) -> None:
    model, tok, _ = loaded
    words = read_constraints(DEFAULT_MODEL_DIR).word_constraint(tok)
    assert words.voice, "the shipped constraints carry a voice bonus"
    seen: list[tuple[np.ndarray, WordState, bool, int | None, Any]] = []
    inner = words.masked_row

    def record(raw: np.ndarray, state: WordState, **kw: Any) -> tuple[np.ndarray, bool]:
        seen.append((raw.copy(), state, kw["last"], kw["banned"], kw["block"]))
        return inner(raw, state, **kw)

    words.masked_row = record  # type: ignore[method-assign]
    reqs = requests(words, tok, 8)
    results = BatchedEngine(model, tok, max_batch=8, words=words, use_block_cache=False).generate(reqs)
    del words.masked_row
    assert len({r.banned for r in reqs}) == len(reqs)
    by_req: dict[int, list[Any]] = {}
    for raw, state, last, banned, block in seen:
        by_req.setdefault(next(i for i, r in enumerate(reqs) if r.banned == banned), []).append(
            (raw, state, last, block))
    moved = 0
    for i, (req, res) in enumerate(zip(reqs, results)):
        state = WordState()
        for n, tok_id in enumerate(res.tokens):
            raw, got_state, last, block = by_req[i][n]  # (one call per row and step, in order)
            assert got_state == state and last == (n + 1 >= req.max_tokens)
            assert list(block) == list(req.blocked_tokens)
            row = raw.astype(np.float32, copy=True)
            words.mask_logits(row, state, last=last, banned=req.banned)  # the client's masks and bonus
            row[list(req.blocked_tokens)] = -np.inf
            assert not vetoed(raw, row, state=state)
            assert tok_id == int(np.argmax(row)), (i, n)
            plain = raw.astype(np.float32, copy=True)
            plain[words.blocked(state, last=last, banned=req.banned)] = -np.inf
            plain[list(req.blocked_tokens)] = -np.inf
            moved += int(np.argmax(plain)) != tok_id  # the bonus chose another token than the masks alone
            state = words.step(state, tok_id)
    assert moved >= 1, "the voice bonus decided at least one greedy token"
