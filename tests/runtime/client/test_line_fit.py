"""The line scorer behind near-state playback: teacher-forced mean log-probabilities in one padded
batch, equal to scoring each line alone, cached, and the state fit built on them."""

from __future__ import annotations

import numpy as np

from runtime.client.line_fit import FitCache, mean_logprobs, state_fit
from runtime.client.onnx_model import FlashOnnx


def _alone(model: FlashOnnx, prompt: list[int], line: list[int]) -> float:
    logits, _, _ = model.step(np.asarray([[*prompt, *line]]), None)
    logp = logits[0] - np.log(np.exp(logits[0] - logits[0].max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits[0].max(-1, keepdims=True)
    return float(np.mean([logp[len(prompt) - 1 + k, t] for k, t in enumerate(line)]))


def test_a_padded_batch_scores_each_line_as_it_would_alone(tiny_model_dir):
    model = FlashOnnx.load(tiny_model_dir)
    tok = model.tokenizer
    p1, _ = tok.encode_prompt("guard", [], "alert", "greet")
    p2, _ = tok.encode_prompt("merchant", ["greedy"], "working", "trade", {"time_of_day": "night"})
    lines = [[*tok.encode("Halt! Who goes there?"), tok.eos_id], [*tok.encode("Coin first."), tok.eos_id]]
    got = mean_logprobs(model, [(p1, lines[0]), (p2, lines[1]), (p1, lines[1])])
    want = [_alone(model, p1, lines[0]), _alone(model, p2, lines[1]), _alone(model, p1, lines[1])]
    assert np.allclose(got, want, atol=1e-4)
    assert mean_logprobs(model, []).shape == (0,)


def test_the_cache_answers_a_repeat_without_the_model_and_the_state_fit_is_a_difference(tiny_model_dir):
    model = FlashOnnx.load(tiny_model_dir)
    tok = model.tokenizer
    asked, _ = tok.encode_prompt("guard", [], "alert", "greet")
    own, _ = tok.encode_prompt("guard", [], "patrol", "greet")
    line = [*tok.encode("Evening."), tok.eos_id]
    cache = FitCache()
    fit = state_fit(model, cache, asked, [own], [line])
    want = mean_logprobs(model, [(asked, line)])[0] - mean_logprobs(model, [(own, line)])[0]
    assert abs(fit[0] - want) < 1e-5  # one batch of two against two batches of one

    class NoModel:
        def step(self, *_a, **_k):
            raise AssertionError("scored again")

    assert state_fit(NoModel(), cache, asked, [own], [line])[0] == fit[0]
    small = FitCache(size=1)
    small.scores(model, [(asked, line), (own, line)])
    assert len(small._scores) == 1
