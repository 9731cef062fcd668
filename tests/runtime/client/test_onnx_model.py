"""FlashOnnx: the onnxruntime decoder over an exported graph (step, KV cache, generation)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from runtime.client.onnx_model import FlashOnnx, session_options
from runtime.factory.export import ExportOptions, build_onnx
from tests.runtime.factory.test_export_fixtures import rel_err, tiny_config, tiny_model


def flash_onnx(weights: str = "int4", **cfg_overrides: object) -> FlashOnnx:
    model = tiny_model(tiny_config(**cfg_overrides))
    moe = "qmoe" if weights == "int4" else "gather"
    graph = build_onnx(model.state_dict(), model.config, ExportOptions(weights=weights, moe=moe))
    session = ort.InferenceSession(graph.SerializeToString(), session_options(1),
                                   providers=["CPUExecutionProvider"])
    return FlashOnnx(session, vars(model.config))


PROMPT = [3, 17, 42, 8, 5]


def test_step_with_past_equals_full_recompute():
    m = flash_onnx()
    ids = np.array([[*PROMPT, 9, 11]])
    full, _, router_full = m.step(ids, None)
    logits, past, router = m.step(ids[:, :5], None)
    assert [p.shape for p in past] == [(1, 2, 5, 32)] * 4
    assert router.shape == (2, 5, 4)
    for t in (5, 6):
        logits, past, router = m.step(ids[:, t:t + 1], past)
        assert rel_err(logits[0, 0], full[0, t]) < 1e-5
        assert np.abs(router[:, 0] - router_full[:, t]).max() < 1e-5
    assert past[0].shape[2] == 7


def test_greedy_generation_follows_the_argmax_of_full_recompute():
    m = flash_onnx()
    got = m.generate_ids(PROMPT, max_tokens=6, temperature=0, eos_id=-1)
    ids = list(PROMPT)
    for _ in range(6):
        logits, _, _ = m.step(np.array([ids]), None)
        ids.append(int(logits[0, -1].argmax()))
    assert got == ids[len(PROMPT):]


def test_generation_is_deterministic_for_a_seed():
    m = flash_onnx()
    a = m.generate_ids(PROMPT, max_tokens=12, temperature=1.0, top_p=1.0, seed=7, eos_id=-1)
    b = m.generate_ids(PROMPT, max_tokens=12, temperature=1.0, top_p=1.0, seed=7, eos_id=-1)
    c = m.generate_ids(PROMPT, max_tokens=12, temperature=1.0, top_p=1.0, seed=8, eos_id=-1)
    assert a == b and len(a) == 12
    assert a != c


def test_generation_stops_at_eos_and_at_the_context_end():
    m = flash_onnx()
    first = m.generate_ids(PROMPT, max_tokens=1, temperature=0, eos_id=-1)
    assert m.generate_ids(PROMPT, max_tokens=5, temperature=0, eos_id=first[0]) == []
    room = m.block_size - len(PROMPT)
    assert len(m.generate_ids(PROMPT, max_tokens=100, temperature=0, eos_id=-1)) == room


def test_fp32_and_int4_models_agree_on_greedy_tokens_mostly():
    fp32, int4 = flash_onnx("fp32"), flash_onnx("int4")
    ids = np.array([[*PROMPT, 9, 11, 30, 31, 2]])
    a, _, _ = fp32.step(ids, None)
    b, _, _ = int4.step(ids, None)
    assert a.shape == b.shape == (1, 10, 96)
    assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.6


def test_bad_inputs_name_the_problem():
    m = flash_onnx()
    with pytest.raises(ValueError, match="input_ids must be"):
        m.step(np.array(PROMPT), None)
    with pytest.raises(ValueError, match="past has 1 arrays"):
        m.step(np.array([PROMPT]), [np.zeros((1, 2, 0, 32), np.float32)])
    with pytest.raises(ValueError, match="exceed the context of 32"):
        m.step(np.zeros((1, 33), np.int64), None)
    with pytest.raises(ValueError, match="attention_mask shape"):
        m.step(np.array([PROMPT]), None, attention_mask=np.ones((1, 3), np.int64))
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        m.generate_ids([], eos_id=0)
    with pytest.raises(ValueError, match="pass eos_id"):
        m.generate_ids(PROMPT)


def test_session_options_keep_one_quiet_thread():
    so = session_options()
    assert so.intra_op_num_threads == 1
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with pytest.raises(ValueError, match="threads"):
        session_options(0)


def test_load_names_the_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model\.int4\.onnx: missing"):
        FlashOnnx.load(tmp_path)


def test_exported_directory_loads_and_generates_lines_reproducibly(tmp_path):
    import json
    from dataclasses import asdict

    import torch

    from runtime.factory.export import export_checkpoint
    from runtime.factory.linebook import load_line_book
    from runtime.tokenizer import train_tokenizer

    book = load_line_book()
    catalog = book.catalog()
    tok = train_tokenizer(["Halt, {player}! Who goes there?", "Fine weather for trading."],
                          catalog, vocab_size=400)
    model = tiny_model(tiny_config(vocab_size=tok.vocab_size, block_size=48))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    torch.save({"config": asdict(model.config), "model": model.state_dict(), "step": 1}, ckpt / "model.pt")
    (ckpt / "config.json").write_text(json.dumps(asdict(model.config)))
    (ckpt / "catalog.json").write_text(json.dumps(catalog))
    tok.save(ckpt / "tokenizer.json")
    export_checkpoint(ckpt, tmp_path / "flash")

    from runtime.client.fallback import FallbackBook

    fallbacks = FallbackBook.from_json(tmp_path / "flash" / "fallbacks.json")
    (arch, state, intent), lines = next(iter(book.fallback_cells().items()))
    assert fallbacks.lines[(arch, state, intent)] == tuple(lines)

    m = FlashOnnx.load(tmp_path / "flash")
    assert m.catalog == catalog and m.tokenizer.vocab_size == tok.vocab_size
    request = dict(persona=[catalog["persona_traits"][0]], intent=catalog["intents"][0])
    arch, state = catalog["archetypes"][0], catalog["states"][0]
    a = m.generate(arch, state, seed=3, max_tokens=10, temperature=1.0, **request)
    b = m.generate(arch, state, seed=3, max_tokens=10, temperature=1.0, **request)
    assert isinstance(a, str) and a == b
    ids, _ = tok.encode_prompt(arch, request["persona"], state, request["intent"], {})
    assert a == tok.decode(m.generate_ids(ids, seed=3, max_tokens=10, temperature=1.0))
    fp32 = FlashOnnx.load(tmp_path / "flash", file="model.onnx")
    assert fp32.session.get_inputs()[0].name == "input_ids"
