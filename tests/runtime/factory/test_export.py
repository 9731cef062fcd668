"""The ONNX export: fp32 and INT4 graphs against the PyTorch model, KV cache, masks, packing."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from runtime.factory.export import (
    MAX_INT4_BYTES,
    ExportError,
    ExportOptions,
    build_moe_block,
    build_onnx,
    export_checkpoint,
    quantize_pack_int4,
    save_model,
    unpack_int4,
)
from runtime.factory.model import Flash, FlashConfig
from runtime.factory.quant import fake_quant_int4
from tests.runtime.factory.test_export_fixtures import (
    build_session,
    feeds,
    rel_err,
    session,
    tiny_config,
    tiny_model,
)

IDS = np.random.default_rng(0).integers(0, 96, size=(2, 7))


def torch_forward(model: Flash, ids: np.ndarray, *, qat: bool):
    model.set_qat(qat)
    with torch.no_grad():
        return model(torch.from_numpy(ids))


def router_stack(out, n_expert: int) -> np.ndarray:
    return np.stack([p.reshape(-1, n_expert).numpy() for p in out.router_probs])


def test_int4_packing_dequantizes_to_the_fake_quant_weights():
    w = torch.randn(24, 96) * torch.linspace(0.01, 3, 96)
    w[3, :32] = 0  # an all-zero block: scale 1, codes 8
    packed, scales = quantize_pack_int4(w.numpy(), 32)
    assert packed.dtype == np.uint8 and packed.shape == (24, 48)
    assert scales.shape == (24, 3)
    assert np.array_equal(unpack_int4(packed, scales, 32), fake_quant_int4(w, 32).numpy())
    # even K index in the low nibble
    q_first = np.clip(np.round(w[0, 0].item() / scales[0, 0]), -8, 7) + 8
    assert packed[0, 0] & 0x0F == q_first


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("moe", ["moe", "gather", "dense"])
def test_fp32_graph_matches_pytorch_prefill(moe: str, top_k: int):
    model = tiny_model(tiny_config(top_k=top_k))
    out = torch_forward(model, IDS, qat=False)
    logits, *present, router = build_session(model, weights="fp32", moe=moe).run(
        None, feeds(model.config, IDS))
    assert rel_err(logits, out.logits.numpy()) < 1e-4
    assert np.abs(router - router_stack(out, model.config.n_expert)).max() < 1e-5
    for i, (k, v) in enumerate(out.present_kv):
        assert rel_err(present[2 * i], k.numpy()) < 1e-4
        assert rel_err(present[2 * i + 1], v.numpy()) < 1e-4


def test_fp32_graph_matches_pytorch_incremental_decode_with_past():
    model = tiny_model()
    cfg = model.config
    sess = build_session(model, weights="fp32", moe="gather")
    _, *present, _ = sess.run(None, feeds(cfg, IDS[:, :5]))
    past_t = torch_forward(model, IDS[:, :5], qat=False).present_kv
    for step in range(5, 7):
        logits, *present, router = sess.run(None, feeds(cfg, IDS[:, step:step + 1], present[:-0 or None]))
        with torch.no_grad():
            out = model(torch.from_numpy(IDS[:, step:step + 1]), past_kv=past_t)
        past_t = out.present_kv
        assert rel_err(logits, out.logits.numpy()) < 1e-4
        assert np.abs(router - router_stack(out, cfg.n_expert)).max() < 1e-5


# INT4 tolerances. With accuracy_level 0 MatMulNBits/QMoE compute in fp32 on the exact QAT
# weights, so with an fp32 embedding table the only differences are summation order (~1e-6).
# An fp16 embedding table rounds each input embedding by <= 2^-11 relative, which moves the
# logits by a few 1e-4 relative. accuracy_level 4 quantizes activations to int8 per block
# (~0.4% per element), which leaves a ~1e-2 relative logit error per token, and it can flip
# the routing of a token whose top two router probs nearly tie (a random tiny model's router
# is near uniform), after which that token's logits differ by the other expert: compared
# only where every layer routed alike.
INT4_CASES = [
    ("qmoe", "fp32", 0, 1e-4),
    ("gather", "fp32", 0, 1e-4),
    ("dense", "fp32", 0, 1e-4),
    ("qmoe", "fp16", 0, 2e-3),
]


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize(("moe", "embedding", "level", "tol"), INT4_CASES)
def test_int4_graph_matches_qat_pytorch(moe: str, embedding: str, level: int, tol: float, top_k: int):
    model = tiny_model(tiny_config(top_k=top_k))
    out = torch_forward(model, IDS, qat=True)
    logits, *_, router = build_session(model, weights="int4", moe=moe, embedding=embedding,
                                       accuracy_level=level).run(None, feeds(model.config, IDS))
    assert rel_err(logits, out.logits.numpy()) < tol
    assert np.abs(router - router_stack(out, model.config.n_expert)).max() < 10 * tol
    # the same experts are chosen
    assert np.array_equal(router.argmax(-1), router_stack(out, model.config.n_expert).argmax(-1))


@pytest.mark.parametrize("seed", [0, 1])
def test_int4_accuracy_level_4_stays_close_where_routing_agrees(seed: int):
    model = tiny_model(seed=seed)
    out = torch_forward(model, IDS, qat=True)
    logits, *_, router = build_session(model, weights="int4", embedding="fp32",
                                       accuracy_level=4).run(None, feeds(model.config, IDS))
    ref_router = router_stack(out, model.config.n_expert)
    same = (router.argmax(-1) == ref_router.argmax(-1)).all(0).reshape(IDS.shape)
    assert same.mean() >= 0.8
    ref = out.logits.numpy()
    assert np.abs(logits - ref)[same].max() / np.abs(ref).max() < 3e-2


@pytest.mark.parametrize(("weights", "moe"), [("int4", "qmoe"), ("int4", "gather"), ("int4", "dense"),
                                             ("fp32", "moe"), ("fp32", "gather"), ("fp32", "dense")])
@pytest.mark.parametrize("top_k", [1, 2])
def test_moe_block_variants_match_the_pytorch_moe(weights: str, moe: str, top_k: int):
    model = tiny_model(tiny_config(top_k=top_k))
    block = model.transformer.h[1].ffn
    x = torch.randn(2, 5, model.config.n_embd, generator=torch.Generator().manual_seed(1))
    model.set_qat(weights == "int4")
    with torch.no_grad():
        ref, probs, _ = block(x)
    opts = ExportOptions(weights=weights, moe=moe, accuracy_level=0)
    y, router = session(build_moe_block(model.state_dict(), model.config, 1, opts)).run(
        None, {"x": x.numpy()})
    assert rel_err(y, ref.numpy()) < 1e-5
    assert np.abs(router - probs.reshape(-1, model.config.n_expert).numpy()).max() < 1e-6


def test_int4_graph_is_quantized_and_sparse():
    model = tiny_model()
    onnx_model = build_onnx(model.state_dict(), model.config, ExportOptions())
    ops = [n.op_type for n in onnx_model.graph.node]
    assert ops.count("QMoE") == model.config.n_layer
    # c_attn + c_proj per layer, and lm_head
    assert ops.count("MatMulNBits") == 2 * model.config.n_layer + 1
    plain_weights = [n for n in onnx_model.graph.node if n.op_type == "MatMul"
                     and any(i.endswith(("c_attn", "c_proj")) or "weight_t" in i for i in n.input)]
    assert plain_weights == []
    # the only large float32 initializers are INT4 block scales and the position table
    big_float = {t.name for t in onnx_model.graph.initializer
                 if t.data_type == 1 and np.prod(t.dims) > model.config.n_embd * model.config.n_expert}
    assert big_float and all(".scales" in n or n.startswith("wpe") for n in big_float)


def test_mlp_layers_and_no_moe_layer_export():
    model = tiny_model(tiny_config(moe_every=2))
    out = torch_forward(model, IDS, qat=True)
    logits, *_, router = build_session(model, weights="int4", embedding="fp32",
                                       accuracy_level=0).run(None, feeds(model.config, IDS))
    assert rel_err(logits, out.logits.numpy()) < 1e-4
    assert router.shape == (1, IDS.size, model.config.n_expert)

    dense = tiny_model(tiny_config(n_layer=1, moe_every=2))
    _, *_, router = build_session(dense, weights="fp32", moe="gather").run(None, feeds(dense.config, IDS))
    assert router.shape == (0, IDS.size, dense.config.n_expert)


@pytest.mark.parametrize("weights", ["fp32", "int4"])
def test_decode_with_past_equals_full_recompute(weights: str):
    model = tiny_model()
    cfg = model.config
    sess = build_session(model, weights=weights, moe="gather" if weights == "fp32" else "qmoe")
    full, *_ = sess.run(None, feeds(cfg, IDS))
    _, *past, _ = sess.run(None, feeds(cfg, IDS[:, :4]))
    steps = []
    for t in range(4, IDS.shape[1]):
        logits, *past, _ = sess.run(None, feeds(cfg, IDS[:, t:t + 1], past))
        steps.append(logits[:, 0])
    assert rel_err(np.stack(steps, axis=1), full[:, 4:]) < 1e-5


def test_left_padding_with_attention_mask_matches_the_unpadded_row():
    model = tiny_model()
    cfg = model.config
    sess = build_session(model, weights="int4")
    short = IDS[1:, :4]
    alone, *_ = sess.run(None, feeds(cfg, short))
    pad = 3
    ids = np.concatenate([IDS[:1], np.concatenate([np.zeros((1, pad), np.int64), short], 1)])
    mask = np.ones_like(ids)
    mask[1, :pad] = 0
    positions = np.stack([np.arange(7), np.concatenate([np.zeros(pad, np.int64), np.arange(4)])])
    both, *past, _ = sess.run(None, feeds(cfg, ids, mask=mask, positions=positions))
    assert rel_err(both[1, pad:], alone[0]) < 1e-5
    # and one decode step for the padded batch keeps the padding masked
    nxt = np.array([[5], [6]])
    step_mask = np.concatenate([mask, np.ones((2, 1), np.int64)], 1)
    stepped, *_ = sess.run(None, feeds(cfg, nxt, past, mask=step_mask, positions=np.array([[7], [4]])))
    ref, *_ = sess.run(None, feeds(cfg, np.concatenate([short, [[6]]], 1)))
    assert rel_err(stepped[1, 0], ref[0, -1]) < 1e-5


def test_default_config_int4_file_fits_the_budget(tmp_path):
    torch.manual_seed(0)
    model = Flash(FlashConfig())
    size = save_model(build_onnx(model.state_dict(), model.config, ExportOptions()), tmp_path / "m.onnx")
    assert size <= MAX_INT4_BYTES


def test_bad_options_are_rejected_with_the_reason():
    with pytest.raises(ExportError, match=r"qmoe.*int4"):
        ExportOptions(weights="fp32", moe="qmoe")
    with pytest.raises(ExportError, match="moe must be one of"):
        ExportOptions(moe="sparse")
    with pytest.raises(ExportError, match="accuracy_level"):
        ExportOptions(accuracy_level=7)
    with pytest.raises(ExportError, match=r"no 'transformer\.h\.0\.attn\.c_attn\.weight'"):
        sd = tiny_model().state_dict()
        del sd["transformer.h.0.attn.c_attn.weight"]
        build_onnx(sd, tiny_config())


def write_checkpoint(path, model: Flash) -> None:
    from dataclasses import asdict

    path.mkdir(parents=True, exist_ok=True)
    torch.save({"config": asdict(model.config), "model": model.state_dict(), "step": 1}, path / "model.pt")
    (path / "config.json").write_text(json.dumps(asdict(model.config)))
    (path / "tokenizer.json").write_text("{}")
    (path / "catalog.json").write_text(json.dumps({"archetypes": ["guard"]}))
    (path / "fallbacks.json").write_text(json.dumps({"guard": {"idle": ["Move along."]}}))


def test_export_checkpoint_writes_both_models_side_files_and_export_json(tmp_path):
    write_checkpoint(tmp_path / "ckpt", tiny_model())
    info = export_checkpoint(tmp_path / "ckpt", tmp_path / "out", accuracy_level=0)
    out = tmp_path / "out"
    for name in ("model.onnx", "model.int4.onnx", "tokenizer.json", "config.json", "catalog.json",
                 "fallbacks.json", "export.json"):
        assert (out / name).is_file(), name
    on_disk = json.loads((out / "export.json").read_text())
    assert on_disk == info
    assert info["files"]["model.int4.onnx"] == (out / "model.int4.onnx").stat().st_size
    assert info["files"]["model.int4.onnx"] < info["files"]["model.onnx"]
    assert info["int4"]["variant"] == "qmoe" and info["int4"]["accuracy_level"] == 0
    assert info["outputs"]["router_probs"] == [2, "B*T", 4]
    assert list(info["inputs"])[:3] == ["input_ids", "position_ids", "attention_mask"]


def test_export_checkpoint_names_the_missing_file(tmp_path):
    write_checkpoint(tmp_path / "ckpt", tiny_model())
    (tmp_path / "ckpt" / "catalog.json").unlink()
    with pytest.raises(ExportError, match=r"catalog\.json: missing"):
        export_checkpoint(tmp_path / "ckpt", tmp_path / "out")


def test_flashnpc_export_cli_writes_the_model_directory(tmp_path, capsys):
    from plugin.cli import main

    write_checkpoint(tmp_path / "ckpt", tiny_model())
    code = main(["export", "onnx", "--model", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out"),
                 "--accuracy-level", "0"])
    assert code == 0
    assert "model.int4.onnx" in capsys.readouterr().out
    info = json.loads((tmp_path / "out" / "export.json").read_text())
    assert info["int4"]["accuracy_level"] == 0
    code = main(["export", "onnx", "--model", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out"),
                 "--json", "--no-progress"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["out"] == str(tmp_path / "out") and report["int4"]["accuracy_level"] == 4


def test_flashnpc_export_cli_reports_a_missing_checkpoint(tmp_path, capsys):
    from plugin.cli import main

    code = main(["export", "onnx", "--model", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")])
    assert code == 2
    assert "missing" in capsys.readouterr().err


def test_export_checkpoint_refuses_an_int4_file_over_the_budget(tmp_path, monkeypatch):
    import runtime.factory.export

    write_checkpoint(tmp_path / "ckpt", tiny_model())
    monkeypatch.setattr(runtime.factory.export, "MAX_INT4_BYTES", 10_000)
    with pytest.raises(ExportError, match=r"model\.int4\.onnx is \d+ bytes, over the 10000-byte budget"):
        export_checkpoint(tmp_path / "ckpt", tmp_path / "out")
