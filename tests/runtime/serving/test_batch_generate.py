import numpy as np
import pytest

from runtime.client.onnx_model import FlashOnnx
from runtime.serving.batch_generate import generate_ids_batch


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return FlashOnnx.load(tiny_model_dir)


def _prompts(model):
    tok = model.tokenizer
    return [
        tok.encode_prompt("guard", ["gruff"], "alert", "greet", {"time_of_day": "night"})[0],
        tok.encode_prompt("sailor", ["cheerful", "kind"], "rest", "farewell", {})[0],
        tok.encode_prompt("guard", ["gruff"], "patrol", "approach", {"weather": "rain"})[0],
    ]


def test_a_row_samples_the_same_tokens_alone_or_in_a_batch(model):
    prompts = _prompts(model)
    together = generate_ids_batch(model, prompts, seeds=[1, 2, 3], max_tokens=12)
    alone = [generate_ids_batch(model, [p], seeds=[s], max_tokens=12)[0] for p, s in zip(prompts, [1, 2, 3])]
    assert together == alone


def test_batched_greedy_matches_the_single_prompt_decoder(model):
    prompt = _prompts(model)[0]
    batched = generate_ids_batch(model, [prompt], seeds=[0], max_tokens=10, temperature=0.0)[0]
    single = model.generate_ids(prompt, max_tokens=10, temperature=0.0)
    assert batched == list(single)


def test_blocked_ids_are_never_emitted(model):
    prompt = _prompts(model)[0]
    free = generate_ids_batch(model, [prompt] * 8, seeds=list(range(8)), max_tokens=16, temperature=1.5)
    common = sorted({t for row in free for t in row})[:20]
    blocked = np.array(common, dtype=np.int64)
    constrained = generate_ids_batch(
        model, [prompt] * 8, seeds=list(range(8)), blocked=[blocked] * 8, max_tokens=16, temperature=1.5
    )
    assert not {t for row in constrained for t in row} & set(common)


def test_mismatched_seed_count_is_rejected(model):
    with pytest.raises(ValueError, match="2 prompts but 1 seeds"):
        generate_ids_batch(model, _prompts(model)[:2], seeds=[0])
