import copy
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from runtime.factory.model import MLP, Flash, FlashConfig, MoE
from runtime.factory.quant import fake_quant_int4

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_config(**overrides) -> FlashConfig:
    base = dict(vocab_size=96, block_size=32, n_layer=2, n_head=2, n_embd=32, n_expert=8,
                expert_hidden=32, top_k=1, moe_every=1)
    base.update(overrides)
    return FlashConfig(**base)


def tiny_model(seed: int = 0, **overrides) -> Flash:
    torch.manual_seed(seed)
    model = Flash(tiny_config(**overrides))
    # spread the router so that different tokens pick different experts
    for block in model.transformer.h:
        if isinstance(block.ffn, MoE):
            torch.nn.init.normal_(block.ffn.router.weight, std=0.5)
    return model.eval()


def tokens(batch: int, length: int, vocab: int = 96, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("overrides", [{}, {"top_k": 2}, {"moe_every": 2}])
def test_cached_decoding_gives_the_same_logits_as_one_full_pass(overrides):
    model = tiny_model(**overrides)
    idx = tokens(2, 12)
    with torch.no_grad():
        full = model(idx).logits
        prefix = model(idx[:, :5])
        steps = [prefix.logits]
        past = prefix.present_kv
        for t in range(5, 12):
            out = model(idx[:, t:t + 1], past_kv=past)
            steps.append(out.logits)
            past = out.present_kv
    assert past[0][0].shape == (2, 2, 12, 16)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-5)


def test_multi_token_chunk_after_cached_prefix_matches_full_pass():
    model = tiny_model()
    idx = tokens(1, 10)
    with torch.no_grad():
        full = model(idx).logits
        prefix = model(idx[:, :4])
        rest = model(idx[:, 4:], past_kv=prefix.present_kv)
    torch.testing.assert_close(rest.logits, full[:, 4:], rtol=1e-4, atol=1e-5)


def test_left_padded_batch_with_attention_mask_matches_each_row_alone():
    model = tiny_model()
    a, b = tokens(1, 7, seed=5)[0], tokens(1, 4, seed=6)[0]
    pad = 3
    idx = torch.stack([a, torch.cat([torch.full((pad,), 0), b])])
    attention_mask = torch.tensor([[1] * 7, [0] * pad + [1] * 4])
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        batch = model(idx, attention_mask=attention_mask, position_ids=position_ids)
        alone_a, alone_b = model(a[None]), model(b[None])
        torch.testing.assert_close(batch.logits[0], alone_a.logits[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(batch.logits[1, pad:], alone_b.logits[0], rtol=1e-4, atol=1e-5)
        assert torch.isfinite(batch.logits).all()
        # one more token for each row, decoded against the padded cache
        nxt = torch.tensor([[5], [9]])
        step_mask = torch.cat([attention_mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
        step = model(nxt, past_kv=batch.present_kv, attention_mask=step_mask,
                     position_ids=position_ids[:, -1:] + 1)
        ref_a = model(nxt[:1], past_kv=alone_a.present_kv).logits[0, -1]
        ref_b = model(nxt[1:], past_kv=alone_b.present_kv).logits[0, -1]
    torch.testing.assert_close(step.logits[0, -1], ref_a, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(step.logits[1, -1], ref_b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("top_k", [1, 2])
def test_only_the_selected_experts_are_computed(monkeypatch, top_k):
    model = tiny_model(top_k=top_k)
    calls: list[tuple[int, int, int]] = []  # (layer, expert, n_tokens)
    for layer, block in enumerate(model.transformer.h):
        original = block.ffn.expert_forward

        def counting(e, x, weights=None, _layer=layer, _original=original):
            calls.append((_layer, e, x.shape[0]))
            return _original(e, x, weights)

        monkeypatch.setattr(block.ffn, "expert_forward", counting)
    idx = tokens(1, 6)
    with torch.no_grad():
        out = model(idx)
    for layer, probs in enumerate(out.router_probs):
        chosen = probs[0].topk(top_k, dim=-1).indices.reshape(-1).tolist()
        expected = Counter(chosen)
        got = {e: n for (lay, e, n) in calls if lay == layer}
        assert got == dict(expected), f"layer {layer}: experts run {got}, routed {dict(expected)}"
    # one decoded token runs exactly top_k experts per MoE layer
    calls.clear()
    with torch.no_grad():
        model(idx[:, :1])
    assert len(calls) == top_k * model.config.n_layer


def test_unselected_experts_get_zero_gradient_and_selected_ones_do_not():
    model = tiny_model().train()
    idx = tokens(1, 3)
    out = model(idx, targets=tokens(1, 3, seed=2))
    out.loss.backward()
    moe = model.transformer.h[0].ffn
    chosen = set(out.router_probs[0][0].argmax(dim=-1).tolist())
    assert 0 < len(chosen) < moe.n_expert
    for e in range(moe.n_expert):
        grad_norm = moe.w1.grad[e].abs().sum() + moe.w2.grad[e].abs().sum()
        assert (grad_norm > 0) == (e in chosen), f"expert {e}"


def test_router_is_float32_under_bfloat16_autocast():
    model = tiny_model()
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        out = model(tokens(2, 8), targets=tokens(2, 8, seed=3))
    assert out.logits.dtype == torch.bfloat16  # the rest of the model did run in bf16
    assert all(p.dtype == torch.float32 for p in out.router_probs)
    assert out.aux_loss.dtype == torch.float32
    for p in out.router_probs:
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1]))
    assert torch.isfinite(out.loss)


def test_top2_weights_are_renormalised_and_top1_uses_the_raw_prob():
    torch.manual_seed(0)
    for top_k in (1, 2):
        moe = MoE(tiny_config(top_k=top_k))
        torch.nn.init.normal_(moe.w1, std=0.1)
        torch.nn.init.normal_(moe.w2, std=0.1)
        torch.nn.init.normal_(moe.router.weight, std=0.5)
        x = torch.randn(1, 5, 32)
        with torch.no_grad():
            y, probs, _ = moe(x)
            p, e = probs[0].topk(top_k, dim=-1)
            if top_k == 2:
                p = p / p.sum(-1, keepdim=True)
            expected = torch.stack([
                sum(p[t, j] * moe.expert_forward(int(e[t, j]), x[0, t:t + 1])[0] for j in range(top_k))
                for t in range(5)
            ])
        torch.testing.assert_close(y[0], expected, rtol=1e-5, atol=1e-6)


def test_loss_counts_only_masked_positions():
    model = tiny_model()
    idx, targets = tokens(2, 10), tokens(2, 10, seed=4)
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[:, 6:] = True
    other = targets.clone()
    other[:, :6] = (other[:, :6] + 1) % 96
    with torch.no_grad():
        a = model(idx, targets, loss_mask=mask)
        b = model(idx, other, loss_mask=mask)
        ce = F.cross_entropy(a.logits[mask], targets[mask])
    torch.testing.assert_close(a.loss, b.loss)
    torch.testing.assert_close(a.ce_loss, ce)
    torch.testing.assert_close(a.loss, a.ce_loss + a.aux_loss)


def test_load_balancing_loss_is_larger_when_routing_collapses():
    torch.manual_seed(0)
    moe = MoE(tiny_config(z_loss_coef=0.0))
    torch.nn.init.normal_(moe.router.weight, std=0.5)
    x = torch.randn(4, 16, 32).abs()  # positive inputs, so a positive router row always wins
    with torch.no_grad():
        _, _, balanced = moe(x)
        moe.router.weight.zero_()
        moe.router.weight[3] = 0.5
        _, probs, collapsed = moe(x)
    assert (probs.argmax(-1) == 3).all()
    assert 0 < balanced < collapsed


def test_qat_applies_the_int4_formula_to_every_exported_weight_but_not_the_router():
    model = tiny_model(moe_every=2)
    qat = copy.deepcopy(model)
    qat.set_qat(True)
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in reference.named_parameters():
            if any(name.endswith(s) for s in ("c_attn.weight", "c_proj.weight", "c_fc.weight", ".w1", ".w2")):
                p.copy_(fake_quant_int4(p, 32))
    hidden = {}
    reference.transformer.ln_f.register_forward_hook(lambda m, i, o: hidden.setdefault("h", o))
    idx = tokens(2, 9)
    with torch.no_grad():
        got = qat(idx).logits
        reference(idx)
        want = F.linear(hidden["h"], fake_quant_int4(reference.lm_head.weight, 32))
        plain = model(idx).logits
    assert isinstance(model.transformer.h[0].ffn, MLP) and isinstance(model.transformer.h[1].ffn, MoE)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, plain, atol=1e-4)


def test_default_config_size_and_sparsity():
    counts = Flash(FlashConfig()).num_params()
    assert 8_000_000 <= counts["total"] <= 16_000_000
    assert counts["active_per_token"] <= 0.25 * counts["total"]
    assert counts["router"] <= 0.01 * counts["total"]
    assert counts["embedding"] == 2048 * 256 + 128 * 256
    assert counts["experts"] == 4 * 16 * 2 * 256 * 256


def test_num_params_counts_tied_embedding_once():
    model = tiny_model()
    unique = {id(p): p.numel() for p in model.parameters()}
    assert model.num_params()["total"] == sum(unique.values())
    assert model.lm_head.weight is model.transformer.wte.weight


def test_sequence_longer_than_block_size_is_rejected():
    model = tiny_model()
    with torch.no_grad():
        prefix = model(tokens(1, 30))
        with pytest.raises(ValueError, match="exceeds block_size 32"):
            model(tokens(1, 3), past_kv=prefix.present_kv)


def test_malformed_attention_mask_and_positions_are_rejected():
    model = tiny_model()
    idx = tokens(2, 5)
    with torch.no_grad(), pytest.raises(ValueError, match=r"attention_mask shape \(2, 4\)"):
        model(idx, attention_mask=torch.ones(2, 4, dtype=torch.long))
    with torch.no_grad(), pytest.raises(ValueError, match=r"position_ids must lie in \[0, 32\)"):
        model(idx, position_ids=torch.full((2, 5), 32))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_embd": 64, "n_head": 3}, "divisible by n_head"),
        ({"top_k": 3}, "top_k must be 1 or 2"),
        ({"expert_hidden": 40}, "expert_hidden .* multiple of quant_block"),
        ({"n_layer": 0}, "n_layer must be a positive int"),
    ],
)
def test_bad_config_is_rejected_naming_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)
