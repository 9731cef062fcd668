"""The onnxruntime batched engine on a tiny exported model: the graph's own next-token logits,
batched lines equal to single-request lines, rows joining mid-batch, the KV kept bounded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runtime.client.onnx_model import FlashOnnx
from runtime.serving.batched_engine import GenRequest
from runtime.serving.dialogue_service import DialogueService
from runtime.serving.ort_engine import OrtBatchedEngine

from .test_batched_engine import check_joining_mid_batch, prompts


@pytest.fixture(scope="module")
def onnx(tiny_model_dir):
    return FlashOnnx.load(tiny_model_dir)


def engine(onnx, **kw) -> OrtBatchedEngine:
    kw.setdefault("max_batch", 16)
    return OrtBatchedEngine(onnx, **kw)


def test_prefill_gives_the_graphs_own_last_logits_for_left_padded_prompts(onnx):
    tok = onnx.tokenizer
    a, b = prompts(tok, 2)
    b = b[:-3]  # a shorter prompt: left-padded in the engine's prefill
    eng = engine(onnx)
    eng.submit(GenRequest(a, max_tokens=2))
    eng.submit(GenRequest(b, max_tokens=2))
    new = eng._admit([])
    with torch.inference_mode():
        got, conf = eng._run(0, new)
    for row, ids in enumerate((a, b)):
        want, _, _ = onnx.step(np.asarray([ids]), None)
        np.testing.assert_allclose(got[row].numpy(), want[0, -1], rtol=1e-4, atol=1e-4)
    assert conf is not None and ((conf > 0) & (conf <= 1)).all()


def test_batched_lines_equal_single_request_lines_for_the_same_seed(onnx):
    tok = onnx.tokenizer
    reqs = [GenRequest(ids, seed=100 + i, max_tokens=12, temperature=1.0, top_k=0 if i % 2 else 20)
            for i, ids in enumerate(prompts(tok, 10))]
    batched = engine(onnx).generate(reqs)
    for req, res in zip(reqs, batched):
        alone = engine(onnx).generate([req])[0]
        assert res.tokens == alone.tokens
        assert res.finish == alone.finish
    assert len({tuple(r.tokens) for r in batched}) > 1


def test_a_request_joining_mid_batch_gets_the_line_it_gets_alone(onnx):
    check_joining_mid_batch(lambda: engine(onnx), onnx.tokenizer)


def test_the_padded_kv_length_follows_the_longest_live_row_not_the_uptime(onnx):
    tok = onnx.tokenizer
    ids = prompts(tok, 1)[0]
    eng = engine(onnx, max_batch=4)
    longest = 0
    for i in range(40):  # a steady stream: the batch never empties
        eng.submit(GenRequest(ids, seed=i, max_tokens=6, min_tokens=6))
        eng.step()
        assert eng.mask.shape == (len(eng.rows), eng.past[0].shape[2])
        if eng.rows:
            longest = max(longest, eng.mask.shape[1])
            assert eng.mask.shape[1] == int(eng._pos[: len(eng.rows)].max())
    assert longest <= len(ids) + 6
    assert eng.steps == 40


def test_cancelled_rows_leave_and_the_rest_finish(onnx):
    tok = onnx.tokenizer
    eng = engine(onnx)
    hs = [eng.submit(GenRequest(ids, seed=i, max_tokens=10, min_tokens=10))
          for i, ids in enumerate(prompts(tok, 4))]
    eng.step()
    eng.cancel(hs[1])
    results = []
    while eng.has_work():
        results += eng.step()
    finish = {id(r.request): r.finish for r in results}
    assert finish[id(hs[1]._seq.req)] == "cancelled"
    assert sorted(finish.values()).count("length") == 3


def test_the_service_picks_onnxruntime_on_a_cpu_and_refuses_it_elsewhere(tiny_model_dir):
    svc = DialogueService.load(tiny_model_dir, max_batch=8)
    assert isinstance(svc.engine, OrtBatchedEngine)
    with pytest.raises(ValueError, match="engine='ort' runs the exported graph on a CPU"):
        DialogueService.load(tiny_model_dir, engine="ort", device="cuda")
    with pytest.raises(ValueError, match="engine must be"):
        DialogueService.load(tiny_model_dir, engine="tensorrt")
