"""Export a Flash checkpoint to ONNX: an fp32 reference graph and the shipped INT4 sparse graph.

The graph is written directly with ``onnx.helper`` from the state_dict (no tracing), so
every node is one we chose and the INT4 weights are exactly the QAT weights.

Graph interface (identical for every variant; ``i`` runs over the ``n_layer`` layers)::

    inputs
      input_ids        int64   [B, T]                       token ids
      position_ids     int64   [B, T]                       absolute positions (< block_size);
                                                            normally P + arange(T), per row
      attention_mask   int64   [B, P + T]                   1 = attend, 0 = padding (past and new)
      past_key_{i}     float32 [B, n_head, P, head_dim]     P may be 0 (empty tensors)
      past_value_{i}   float32 [B, n_head, P, head_dim]
    outputs
      logits           float32 [B, T, vocab_size]
      present_key_{i}  float32 [B, n_head, P + T, head_dim] past followed by the new keys
      present_value_{i} float32 [B, n_head, P + T, head_dim]
      router_probs     float32 [n_moe_layers, B * T, n_expert]   softmax of each MoE router,
                                                            token order b * T + t

Query ``t`` of row ``b`` attends key ``j`` iff ``j <= P + t`` (causal) and
``attention_mask[b, j] == 1``. A query whose every key is masked (a padding position)
gets a uniform attention row, never NaN; its logits are meaningless and ignored.

Variants (``moe=``): how a mixture-of-experts block is computed.

    qmoe    com.microsoft.QMoE, INT4 experts; only the selected experts are touched (INT4 only)
    gather  GatherBlockQuantized (INT4) / Gather (fp32) of the selected experts' weights per
            token, then batched MatMul: truly sparse with standard-ish operators
    moe     com.microsoft.MoE, fp32 experts, sparse (fp32 only)
    dense   every expert computed for every token (one stacked MatMul / MatMulNBits), then
            weighted by the top-k gate (zero for unselected experts): the non-sparse baseline

Routing matches :class:`runtime.factory.model.MoE`: probs = softmax(router(x)) in fp32; top-1 output
= raw top prob * expert(x); top-2 output = renormalised top-2 probs. (onnxruntime's QMoE CPU
kernel weights a top-1 expert by 1 whatever ``normalize_routing_weights`` says, so the qmoe
variant runs it with renormalised weights and multiplies by the top prob itself for top-1.)

INT4 (``weights="int4"``): every weight the QAT model fake-quantizes (c_attn, c_proj, MLP,
expert w1/w2, lm_head) is quantized with :func:`runtime.factory.quant.quantize_int4` and stored as
``q + 8`` two per byte (even K index in the low nibble) with the same float32 block scales,
no zero-point input (= 8), so ``MatMulNBits`` / ``QMoE`` / ``GatherBlockQuantized``
dequantize to exactly the QAT weights. The router stays fp32. The token embedding (which
the PyTorch model reads unquantized) is stored per ``embedding=``: ``fp16`` (a half table),
``int4`` (the lm_head INT4 bytes shared through GatherBlockQuantized) or ``fp32``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

if TYPE_CHECKING:
    from runtime.client.bigrams import BigramTable
    from runtime.client.trigrams import TrigramTable
    from runtime.factory.linebook import LineBook

OPSET = 17
MS_DOMAIN = "com.microsoft"
MOE_VARIANTS = ("qmoe", "gather", "moe", "dense")
EMBEDDINGS = ("fp16", "int4", "fp32")
LN_EPS = 1e-5
MASK_VALUE = -1e9
MAX_INT4_BYTES = 8_000_000  # the shipped file's budget (8 MB)

_CONFIG_KEYS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "n_expert",
                "expert_hidden", "top_k", "moe_every", "quant_block")


class ExportError(ValueError):
    """A checkpoint or export option the exporter cannot turn into a graph."""


# --------------------------------------------------------------------------- INT4 packing


def quantize_pack_int4(w: np.ndarray, block: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Quantize ``w`` [..., K] with the QAT formula and pack it for onnxruntime.

    Returns ``(packed, scales)``: ``packed`` uint8 [..., K // 2] holding ``q + 8`` two per
    byte, the even K index in the low nibble; ``scales`` float32 [..., K // block].
    Dequantizing ``(nibble - 8) * scale`` gives exactly ``fake_quant_int4(w, block)``.
    """
    import torch

    from runtime.factory.quant import quantize_int4

    if w.shape[-1] % 2:
        raise ExportError(f"INT4 packing needs an even K, got shape {w.shape}")
    q, scales = quantize_int4(torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)), block)
    u = (q.numpy().astype(np.int16) + 8).astype(np.uint8)
    packed = (u[..., 0::2] | (u[..., 1::2] << 4)).astype(np.uint8)
    return packed, scales.numpy().astype(np.float32)


def unpack_int4(packed: np.ndarray, scales: np.ndarray, block: int = 32) -> np.ndarray:
    """Numpy reference dequantization of :func:`quantize_pack_int4` output."""
    low = (packed & 0x0F).astype(np.float32) - 8
    high = (packed >> 4).astype(np.float32) - 8
    q = np.stack([low, high], axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    qb = q.reshape(*q.shape[:-1], q.shape[-1] // block, block)
    return (qb * scales[..., None]).reshape(q.shape)


# --------------------------------------------------------------------------- graph builder


@dataclass
class ExportOptions:
    """What to build. ``accuracy_level`` is MatMulNBits' (0 = fp32 compute, 4 = int8 activations)."""

    weights: str = "int4"          # "fp32" | "int4"
    moe: str = "qmoe"              # one of MOE_VARIANTS
    accuracy_level: int = 4
    embedding: str = "fp16"        # INT4 graph only: one of EMBEDDINGS
    fake_quant_fp32: bool = False  # fp32 graph with the INT4-dequantized weights (diagnostics)

    def __post_init__(self) -> None:
        if self.weights not in ("fp32", "int4"):
            raise ExportError(f"weights must be 'fp32' or 'int4', got {self.weights!r}")
        if self.moe not in MOE_VARIANTS:
            raise ExportError(f"moe must be one of {MOE_VARIANTS}, got {self.moe!r}")
        if self.weights == "fp32" and self.moe == "qmoe":
            raise ExportError("moe='qmoe' needs weights='int4' (use 'moe', 'gather' or 'dense')")
        if self.weights == "int4" and self.moe == "moe":
            raise ExportError("moe='moe' is the fp32 MoE operator; use 'qmoe' for INT4")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise ExportError(f"accuracy_level must be 0..4, got {self.accuracy_level!r}")
        if self.embedding not in EMBEDDINGS:
            raise ExportError(f"embedding must be one of {EMBEDDINGS}, got {self.embedding!r}")


@dataclass
class _Graph:
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    counter: int = 0

    def name(self, hint: str) -> str:
        self.counter += 1
        return f"{hint}_{self.counter}"

    def const(self, hint: str, array: np.ndarray) -> str:
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type: str, inputs: list[str], hint: str | None = None, *, n_out: int = 1,
           domain: str = "", out: str | None = None, **attrs: Any) -> str | list[str]:
        """Append a node; its output is named from ``hint`` (unique), or exactly ``out`` (a
        graph output: naming the producer's output spares an Identity, which onnxruntime runs
        as a copy)."""
        base = self.name(hint or op_type)
        outs = [out] if out is not None else [base] if n_out == 1 else [f"{base}_{j}" for j in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=base, domain=domain, **attrs))
        return outs[0] if n_out == 1 else outs


def _np(t: Any) -> np.ndarray:
    if hasattr(t, "detach"):
        t = t.detach().cpu().float().numpy()
    return np.ascontiguousarray(np.asarray(t, dtype=np.float32))


def _fake_quant_np(w: np.ndarray, block: int) -> np.ndarray:
    packed, scales = quantize_pack_int4(w, block)
    return unpack_int4(packed, scales, block)


class _Builder:
    def __init__(self, sd: Mapping[str, Any], cfg: Mapping[str, Any], opts: ExportOptions) -> None:
        self.sd = sd
        self.cfg = cfg
        self.o = opts
        self.g = _Graph()
        self.block = int(cfg["quant_block"])
        self.int4 = opts.weights == "int4"

    def w(self, key: str) -> np.ndarray:
        if key not in self.sd:
            raise ExportError(f"state_dict has no {key!r} (is this a Flash checkpoint?)")
        return _np(self.sd[key])

    def quantizable(self, w: np.ndarray) -> np.ndarray:
        return _fake_quant_np(w, self.block) if self.o.fake_quant_fp32 else w

    # y = x @ W^T for W [N, K]
    def linear(self, x: str, w: np.ndarray, hint: str) -> str:
        n, k = w.shape
        if self.int4:
            packed, scales = quantize_pack_int4(w, self.block)
            b = self.g.const(f"{hint}.qweight", packed.reshape(n, k // self.block, self.block // 2))
            s = self.g.const(f"{hint}.scales", scales.reshape(-1))
            return self.g.op("MatMulNBits", [x, b, s], hint, domain=MS_DOMAIN, K=k, N=n, bits=4,
                             block_size=self.block, accuracy_level=self.o.accuracy_level)
        wt = self.g.const(f"{hint}.weight_t", np.ascontiguousarray(self.quantizable(w).T))
        return self.g.op("MatMul", [x, wt], hint)

    def layernorm(self, x: str, key: str) -> str:
        scale = self.g.const(key, self.w(key))
        bias_key = key[: -len("weight")] + "bias"
        bias = self.w(bias_key) if bias_key in self.sd and self.sd[bias_key] is not None else \
            np.zeros(int(self.cfg["n_embd"]), np.float32)
        b = self.g.const(bias_key, bias)
        return self.g.op("LayerNormalization", [x, scale, b], "ln", axis=-1, epsilon=LN_EPS)

    def silu(self, x: str) -> str:
        return self.g.op("Mul", [x, self.g.op("Sigmoid", [x])], "silu")

    def i64(self, hint: str, values: list[int]) -> str:
        return self.g.const(hint, np.array(values, dtype=np.int64))

    # ---------------------------------------------------------------- pieces

    def embed(self, ids: str) -> str:
        g = self.g
        wte = self.w("transformer.wte.weight")
        if not self.int4 or self.o.embedding == "fp32":
            return g.op("Gather", [g.const("wte", wte), ids], "wte", axis=0)
        if self.o.embedding == "fp16":
            half = g.op("Gather", [g.const("wte_fp16", wte.astype(np.float16)), ids], "wte", axis=0)
            return g.op("Cast", [half], "wte_f32", to=TensorProto.FLOAT)
        # int4: reuse the lm_head bytes (tied weights) through a reshape of the same initializer
        packed_name, scales_name = self.lm_head_int4_names
        v, c = wte.shape
        data = g.op("Reshape", [packed_name, self.i64("shape", [v, c // 2])], "wte_q")
        scales = g.op("Reshape", [scales_name, self.i64("shape", [v, c // self.block])], "wte_s")
        return g.op("GatherBlockQuantized", [data, ids, scales], "wte", domain=MS_DOMAIN,
                    gather_axis=0, quantize_axis=1, block_size=self.block, bits=4)

    def attention(self, x: str, i: int, bias: str, past_k: str, past_v: str,
                  present_k: str | None = None, present_v: str | None = None) -> tuple[str, str, str]:
        g, cfg = self.g, self.cfg
        c, nh = int(cfg["n_embd"]), int(cfg["n_head"])
        hd = c // nh
        p = f"transformer.h.{i}.attn"
        qkv = self.linear(x, self.w(f"{p}.c_attn.weight"), f"h{i}.c_attn")
        q, k, v = g.op("Split", [qkv, self.i64("split", [c, c, c])], "qkv", n_out=3, axis=-1)
        heads = self.i64("heads", [0, 0, nh, hd])

        def to_heads(t: str) -> str:
            return g.op("Transpose", [g.op("Reshape", [t, heads])], perm=[0, 2, 1, 3])

        q = g.op("Mul", [to_heads(q), g.const("scale", np.array(1.0 / np.sqrt(hd), np.float32))])
        k_all = g.op("Concat", [past_k, to_heads(k)], "k_all", out=present_k, axis=2)
        v_all = g.op("Concat", [past_v, to_heads(v)], "v_all", out=present_v, axis=2)
        kt = g.op("Transpose", [k_all], perm=[0, 1, 3, 2])
        scores = g.op("Add", [g.op("MatMul", [q, kt], "scores"), bias])
        att = g.op("Softmax", [scores], axis=-1)
        y = g.op("Transpose", [g.op("MatMul", [att, v_all])], perm=[0, 2, 1, 3])
        y = g.op("Reshape", [y, self.i64("merge", [0, 0, c])])
        return self.linear(y, self.w(f"{p}.c_proj.weight"), f"h{i}.c_proj"), k_all, v_all

    def mlp(self, x: str, i: int) -> str:
        p = f"transformer.h.{i}.ffn"
        h = self.silu(self.linear(x, self.w(f"{p}.c_fc.weight"), f"h{i}.c_fc"))
        return self.linear(h, self.w(f"{p}.c_proj.weight"), f"h{i}.mlp_proj")

    def top_k_gates(self, probs: str) -> tuple[str, str]:
        """(weights [N, k], experts [N, k]) as runtime.factory.model.MoE computes them."""
        g = self.g
        k = int(self.cfg["top_k"])
        vals, idx = g.op("TopK", [probs, self.i64("k", [k])], "topk", n_out=2, axis=-1)
        if k > 1:
            vals = g.op("Div", [vals, g.op("ReduceSum", [vals, self.i64("ax", [-1])], keepdims=1)])
        return vals, idx

    def moe(self, x: str, i: int) -> tuple[str, str]:
        g, cfg = self.g, self.cfg
        c, e_n, k = int(cfg["n_embd"]), int(cfg["n_expert"]), int(cfg["top_k"])
        hid = int(cfg["expert_hidden"])
        p = f"transformer.h.{i}.ffn"
        flat = g.op("Reshape", [x, self.i64("flat", [-1, c])], "flat")  # [N, C]
        router_t = g.const(f"h{i}.router_t", np.ascontiguousarray(self.w(f"{p}.router.weight").T))
        logits = g.op("MatMul", [flat, router_t], f"h{i}.router_logits")
        probs = g.op("Softmax", [logits], f"h{i}.router_probs", axis=-1)
        w1, w2 = self.w(f"{p}.w1"), self.w(f"{p}.w2")  # [E, H, C], [E, C, H]
        variant = self.o.moe

        if variant == "qmoe":
            p1, s1 = quantize_pack_int4(w1, self.block)
            p2, s2 = quantize_pack_int4(w2, self.block)
            y = g.op("QMoE", [flat, logits, g.const(f"h{i}.fc1.qweight", p1), g.const(f"h{i}.fc1.scales", s1), "",
                              g.const(f"h{i}.fc2.qweight", p2), g.const(f"h{i}.fc2.scales", s2)],
                     f"h{i}.qmoe", domain=MS_DOMAIN, k=k, activation_type="silu",
                     expert_weight_bits=4, block_size=self.block, normalize_routing_weights=1)
            if k == 1:  # QMoE weights a lone expert by 1; the model weights it by its prob
                y = g.op("Mul", [y, g.op("ReduceMax", [probs], axes=[-1], keepdims=1)], "gate")
        elif variant == "moe":
            y = g.op("MoE", [flat, logits, g.const(f"h{i}.fc1", self.quantizable(w1)), "",
                             g.const(f"h{i}.fc2", self.quantizable(w2))],
                     f"h{i}.moe", domain=MS_DOMAIN, k=k, activation_type="silu",
                     normalize_routing_weights=int(k > 1))
        elif variant == "gather":
            gate, experts = self.top_k_gates(probs)  # [N, k]
            if self.int4:
                p1, s1 = quantize_pack_int4(w1, self.block)
                p2, s2 = quantize_pack_int4(w2, self.block)

                def pick(packed: np.ndarray, scales: np.ndarray, hint: str) -> str:
                    return g.op("GatherBlockQuantized",
                                [g.const(f"{hint}.qweight", packed), experts, g.const(f"{hint}.scales", scales)],
                                hint, domain=MS_DOMAIN, gather_axis=0, quantize_axis=2,
                                block_size=self.block, bits=4)

                sel1, sel2 = pick(p1, s1, f"h{i}.fc1"), pick(p2, s2, f"h{i}.fc2")
            else:
                sel1 = g.op("Gather", [g.const(f"h{i}.fc1", self.quantizable(w1)), experts], axis=0)
                sel2 = g.op("Gather", [g.const(f"h{i}.fc2", self.quantizable(w2)), experts], axis=0)
            col = g.op("Reshape", [flat, self.i64("col", [-1, 1, c, 1])])            # [N, 1, C, 1]
            h = self.silu(g.op("MatMul", [sel1, col], f"h{i}.fc1"))                  # [N, k, H, 1]
            out = g.op("MatMul", [sel2, h], f"h{i}.fc2")                             # [N, k, C, 1]
            out = g.op("Reshape", [out, self.i64("nkc", [-1, k, c])])
            weighted = g.op("Mul", [out, g.op("Unsqueeze", [gate, self.i64("ax", [-1])])])
            y = g.op("ReduceSum", [weighted, self.i64("ax", [1])], keepdims=0)
        else:  # dense: all experts, one stacked matmul each way, gated
            gate, experts = self.top_k_gates(probs)
            zeros = g.op("Mul", [probs, g.const("zero", np.array(0.0, np.float32))])
            gates = g.op("ScatterElements", [zeros, experts, gate], "gates", axis=1)  # [N, E]
            h = self.silu(self.linear(flat, w1.reshape(e_n * hid, c), f"h{i}.fc1_all"))
            h = g.op("Reshape", [h, self.i64("neh", [-1, e_n, hid])])
            h = g.op("Mul", [h, g.op("Unsqueeze", [gates, self.i64("ax", [-1])])])
            h = g.op("Reshape", [h, self.i64("nf", [-1, e_n * hid])])
            w2_cat = np.ascontiguousarray(w2.transpose(1, 0, 2).reshape(c, e_n * hid))
            y = self.linear(h, w2_cat, f"h{i}.fc2_all")
        shape = g.op("Shape", [x])
        return g.op("Reshape", [y, shape], f"h{i}.moe_out"), probs

    # ---------------------------------------------------------------- whole model

    def build(self) -> onnx.ModelProto:
        g, cfg = self.g, self.cfg
        n_layer, nh = int(cfg["n_layer"]), int(cfg["n_head"])
        hd = int(cfg["n_embd"]) // nh
        e_n = int(cfg["n_expert"])

        wte = self.w("transformer.wte.weight")
        lm = _np(self.sd["lm_head.weight"]) if "lm_head.weight" in self.sd else wte
        if self.int4:
            packed, scales = quantize_pack_int4(lm, self.block)
            v, c = lm.shape
            self.lm_head_int4_names = (
                g.const("lm_head.qweight", packed.reshape(v, c // self.block, self.block // 2)),
                g.const("lm_head.scales", scales.reshape(-1)),
            )

        # attention bias [B, 1, T, P+T] from causality and the padding mask
        t_len = g.op("Gather", [g.op("Shape", ["input_ids"]), self.i64("one", [1])], "T")
        s_len = g.op("Gather", [g.op("Shape", ["attention_mask"]), self.i64("one", [1])], "S")
        p_len = g.op("Sub", [s_len, t_len], "P")
        zero = g.const("zero", np.array(0, np.int64))
        step = g.const("one", np.array(1, np.int64))
        squeeze_ax = self.i64("ax", [0])
        s_scalar = g.op("Squeeze", [s_len, squeeze_ax])
        k_pos = g.op("Unsqueeze", [g.op("Range", [zero, s_scalar, step]), squeeze_ax])  # [1, S]
        q_pos = g.op("Range", [g.op("Squeeze", [p_len, squeeze_ax]), s_scalar, step])
        q_pos = g.op("Unsqueeze", [q_pos, self.i64("ax", [1])])                          # [T, 1]
        causal = g.op("LessOrEqual", [k_pos, q_pos], "causal")                          # [T, S]
        pad = g.op("Cast", ["attention_mask"], to=TensorProto.BOOL)
        pad = g.op("Unsqueeze", [pad, self.i64("ax", [1, 2])])                           # [B,1,1,S]
        allowed = g.op("And", [causal, pad], "allowed")
        bias = g.op("Where", [allowed, g.const("zero_f", np.array(0.0, np.float32)),
                              g.const("masked", np.array(MASK_VALUE, np.float32))], "attn_bias")

        x = g.op("Add", [self.embed("input_ids"),
                         g.op("Gather", [g.const("wpe", self.w("transformer.wpe.weight")),
                                         "position_ids"], "wpe", axis=0)], "x")
        presents: list[str] = []
        router: list[str] = []
        for i in range(n_layer):
            h = self.layernorm(x, f"transformer.h.{i}.ln_1.weight")
            a, _, _ = self.attention(h, i, bias, f"past_key_{i}", f"past_value_{i}",
                                     f"present_key_{i}", f"present_value_{i}")
            presents += [f"present_key_{i}", f"present_value_{i}"]
            x = g.op("Add", [x, a], "resid")
            h = self.layernorm(x, f"transformer.h.{i}.ln_2.weight")
            if f"transformer.h.{i}.ffn.router.weight" in self.sd:
                f, probs = self.moe(h, i)
                router.append(g.op("Unsqueeze", [probs, self.i64("ax", [0])]))
            else:
                f = self.mlp(h, i)
            x = g.op("Add", [x, f], "resid")
        x = self.layernorm(x, "transformer.ln_f.weight")
        if self.int4:
            qw, qs = self.lm_head_int4_names
            v, c = lm.shape
            g.op("MatMulNBits", [x, qw, qs], "lm_head", domain=MS_DOMAIN, out="logits", K=c, N=v,
                 bits=4, block_size=self.block, accuracy_level=self.o.accuracy_level)
        else:
            g.op("MatMul", [x, g.const("lm_head_t", np.ascontiguousarray(
                self.quantizable(lm).T))], "lm_head", out="logits")
        if router:
            g.nodes.append(helper.make_node("Concat", router, ["router_probs"], axis=0))
        else:  # no MoE layer: an empty [0, B*T, E] tensor keeps the interface
            n_tok = g.op("ReduceProd", [g.op("Shape", ["input_ids"])], keepdims=1)
            shape = g.op("Concat", [self.i64("z", [0]), n_tok, self.i64("e", [e_n])], axis=0)
            g.nodes.append(helper.make_node("ConstantOfShape", [shape], ["router_probs"],
                                            value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0])))

        f32, i64 = TensorProto.FLOAT, TensorProto.INT64
        inputs = [helper.make_tensor_value_info("input_ids", i64, ["batch", "seq"]),
                  helper.make_tensor_value_info("position_ids", i64, ["batch", "seq"]),
                  helper.make_tensor_value_info("attention_mask", i64, ["batch", "total"])]
        for i in range(n_layer):
            for kind in ("key", "value"):
                inputs.append(helper.make_tensor_value_info(f"past_{kind}_{i}", f32,
                                                            ["batch", nh, "past", hd]))
        outputs = [helper.make_tensor_value_info("logits", f32,
                                                 ["batch", "seq", int(cfg["vocab_size"])])]
        outputs += [helper.make_tensor_value_info(n, f32, ["batch", nh, "total", hd]) for n in presents]
        outputs.append(helper.make_tensor_value_info("router_probs", f32,
                                                     [len(router), "tokens", e_n]))
        graph = helper.make_graph(g.nodes, "flash", inputs, outputs, g.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                        helper.make_opsetid(MS_DOMAIN, 1)],
                                  producer_name="flashnpc")
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def build_onnx(state_dict: Mapping[str, Any], config: Mapping[str, Any] | Any,
               options: ExportOptions | None = None) -> onnx.ModelProto:
    """Build the ONNX graph for a Flash ``state_dict`` (tensors or arrays) and its config.

    ``config`` is a FlashConfig or a mapping with its fields. See the module docstring for
    the interface and the variants.
    """
    cfg = _config_dict(config)
    return _Builder(state_dict, cfg, options or ExportOptions()).build()


def build_moe_block(state_dict: Mapping[str, Any], config: Mapping[str, Any] | Any, layer: int,
                    options: ExportOptions | None = None) -> onnx.ModelProto:
    """A graph of MoE layer ``layer`` alone: ``x`` float32 [B, T, n_embd] -> ``y``, ``router_probs``.

    For benchmarking the variants in isolation and checking them against ``runtime.factory.model.MoE``.
    """
    cfg = _config_dict(config)
    b = _Builder(state_dict, cfg, options or ExportOptions())
    y, probs = b.moe("x", layer)
    b.g.nodes += [helper.make_node("Identity", [y], ["y"]),
                  helper.make_node("Identity", [probs], ["router_probs"])]
    c, e_n = int(cfg["n_embd"]), int(cfg["n_expert"])
    graph = helper.make_graph(
        b.g.nodes, f"flash_moe_{layer}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", c])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", c]),
         helper.make_tensor_value_info("router_probs", TensorProto.FLOAT, ["tokens", e_n])],
        b.g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid(MS_DOMAIN, 1)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _config_dict(config: Mapping[str, Any] | Any) -> dict[str, Any]:
    cfg = dict(config) if isinstance(config, Mapping) else dict(vars(config))
    missing = [k for k in _CONFIG_KEYS if k not in cfg]
    if missing:
        raise ExportError(f"config is missing {missing}")
    return cfg


def io_signature(config: Mapping[str, Any] | Any) -> dict[str, dict[str, list[int | str]]]:
    """Names and symbolic shapes of the graph's inputs and outputs (for export.json and docs)."""
    cfg = _config_dict(config)
    nh = int(cfg["n_head"])
    hd = int(cfg["n_embd"]) // nh
    n_moe = sum(1 for i in range(int(cfg["n_layer"]))
                if i % int(cfg["moe_every"]) == int(cfg["moe_every"]) - 1)
    inputs: dict[str, list[int | str]] = {"input_ids": ["B", "T"], "position_ids": ["B", "T"],
                                          "attention_mask": ["B", "P+T"]}
    outputs: dict[str, list[int | str]] = {"logits": ["B", "T", int(cfg["vocab_size"])]}
    for i in range(int(cfg["n_layer"])):
        for kind in ("key", "value"):
            inputs[f"past_{kind}_{i}"] = ["B", nh, "P", hd]
            outputs[f"present_{kind}_{i}"] = ["B", nh, "P+T", hd]
    outputs["router_probs"] = [n_moe, "B*T", int(cfg["n_expert"])]
    return {"inputs": inputs, "outputs": outputs}


def save_model(model: onnx.ModelProto, path: str | Path) -> int:
    """Write ``model`` as one self-contained file; returns its size in bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path.stat().st_size


# --------------------------------------------------------------------------- checkpoint export


def load_checkpoint(model_dir: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state_dict, config dict) from ``model_dir/model.pt`` as written by ``flashnpc train``."""
    import torch

    path = Path(model_dir) / "model.pt"
    if not path.is_file():
        raise ExportError(f"{path}: no checkpoint (expected model.pt from `flashnpc train`)")
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(ckpt, dict) or "model" not in ckpt or "config" not in ckpt:
        raise ExportError(f"{path}: expected a dict with 'config' and 'model' keys")
    return ckpt["model"], _config_dict(ckpt["config"])


SIDE_FILES = ("tokenizer.json", "config.json", "catalog.json", "fallbacks.json", "constraints.json")


EXPORT_STAGES = ("loading the checkpoint", "fp32 reference", "INT4 graph", "side files")


def export_checkpoint(model_dir: str | Path, out_dir: str | Path, *, accuracy_level: int = 4,
                      moe: str = "qmoe", embedding: str = "fp16",
                      progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Export ``model_dir`` (model.pt, tokenizer.json, config.json, catalog.json) to ``out_dir``.

    Writes model.onnx (fp32 reference), model.int4.onnx (shipped), copies the side files and
    writes export.json, whose content is returned. Raises ExportError if the INT4 file is
    over 8 MiB or a required file is missing. ``progress`` is called with the name of each
    stage of :data:`EXPORT_STAGES` as it starts.
    """
    import onnxruntime as ort

    say = progress or (lambda _stage: None)
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    for name in ("tokenizer.json", "config.json", "catalog.json"):
        if not (model_dir / name).is_file():
            raise ExportError(f"{model_dir / name}: missing (a checkpoint directory needs it)")
    say(EXPORT_STAGES[0])
    sd, cfg = load_checkpoint(model_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # the reference uses standard ONNX operators only (any runtime can check it)
    say(EXPORT_STAGES[1])
    fp32_moe = "gather" if moe == "qmoe" else moe
    fp32_size = save_model(build_onnx(sd, cfg, ExportOptions(weights="fp32", moe=fp32_moe)),
                           out_dir / "model.onnx")
    say(EXPORT_STAGES[2])
    opts = ExportOptions(weights="int4", moe=moe, accuracy_level=accuracy_level, embedding=embedding)
    int4_size = save_model(build_onnx(sd, cfg, opts), out_dir / "model.int4.onnx")
    if int4_size > MAX_INT4_BYTES:
        raise ExportError(f"{out_dir / 'model.int4.onnx'} is {int4_size} bytes, over the "
                          f"{MAX_INT4_BYTES}-byte budget; try embedding='int4'")
    say(EXPORT_STAGES[3])
    copied = []
    for name in SIDE_FILES:
        if (model_dir / name).is_file():
            if (model_dir / name).resolve() != (out_dir / name).resolve():
                shutil.copyfile(model_dir / name, out_dir / name)
            copied.append(name)
    # written from the line book when the checkpoint has none, so that a client loading the
    # model directory never needs the line book (or YAML)
    for name, write in (("fallbacks.json", write_fallbacks), ("constraints.json", write_constraints)):
        if name not in copied:
            write(out_dir / name)
            copied.append(name)
    info = {
        "files": {"model.onnx": fp32_size, "model.int4.onnx": int4_size},
        "int4": {"variant": moe, "accuracy_level": accuracy_level, "embedding": embedding,
                 "block_size": int(cfg["quant_block"]), "symmetric": True},
        "fp32": {"variant": fp32_moe},
        "opset": {"ai.onnx": OPSET, MS_DOMAIN: 1},
        "onnxruntime_version": ort.__version__,
        "onnx_version": onnx.__version__,
        "config": {k: cfg[k] for k in _CONFIG_KEYS},
        "copied": copied,
        **io_signature(cfg),
    }
    (out_dir / "export.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def write_fallbacks(path: Path) -> None:
    """fallbacks.json (version 3, :mod:`runtime.client.fallback`): the default line book's
    fallback cells, {"version": 3, "strings": [lines], "lines": {archetype: {state: {intent or
    "any": [indexes into strings]}}}} (compact, as constraints.json)."""
    from runtime.client.fallback import FallbackBook
    from runtime.factory.linebook import load_line_book

    doc = FallbackBook(load_line_book().fallback_cells()).to_doc()
    path.write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n")


VOICE_BONUS: dict[str, float] = {"archetype": 3.0, "persona": 8.0, "context": 6.0, "unasked": 2.0, "within": 5.0}
"""The voice bonus written into constraints.json (:meth:`runtime.client.constraints.WordConstraint.voice_bonus`),
chosen with ``flashnpc eval`` on the shipped model (docs/model.md, "Decoding"): signature words of
a requested tag are worth this many logits, within 5 logits of the model's most likely token."""


SHIP_BIGRAMS = True
"""Whether :func:`write_constraints` (and so ``flashnpc export``) writes the book's word bigrams by
default. On since the shipped ``runtime/assets/flash/constraints.json`` was re-derived with them
(the export writes what ships; docs/model.md, "Decoding")."""

SHIP_TRIGRAMS = True
"""Whether :func:`write_constraints` writes the book's word trigrams by default
(:mod:`runtime.client.trigrams`: a finished line with a trigram the book never says is drawn again)."""


def book_lines(book: LineBook) -> list[str]:
    """Every line the vocabulary and the word bigrams come from: each expanded example's text,
    then each fallback line (a book without ``fallback_lines``, a stand-in, gives its examples)."""
    texts = [e.text for e in book.examples()]
    fallbacks = getattr(book, "fallback_lines", None)
    if fallbacks is not None:
        texts += [line for lines in fallbacks().values() for line in lines]
    return texts


def book_bigrams(book: LineBook) -> BigramTable:
    """The line book's word bigrams (:class:`runtime.client.bigrams.BigramTable`): which words
    and slots follow which inside a sentence piece, and which start one, over the same lines the
    vocabulary comes from (:func:`book_lines`) and read by the same word rule
    (:func:`runtime.client.bigrams.piece_words`)."""
    from runtime.client.bigrams import BigramTable

    return BigramTable.from_texts(book_lines(book), book.vocabulary(), book.slots)


def book_trigrams(book: LineBook) -> TrigramTable:
    """The line book's word trigrams (:class:`runtime.client.trigrams.TrigramTable`) over the
    same lines as :func:`book_bigrams` (:func:`book_lines`)."""
    from runtime.client.trigrams import TrigramTable

    return TrigramTable.from_texts(book_lines(book))


def write_constraints(path: Path, voice: dict[str, float] | None = None, *,
                      bigrams: bool | None = None, trigrams: bool | None = None) -> dict[str, Any]:
    """constraints.json (the format :func:`runtime.client.constraints.read_constraints` reads): the
    default line book's banned words and slot rules, its vocabulary (every word its lines and
    fallbacks say) and its signatures (the phrases that voice one archetype, persona trait or
    context value only), derived here so a client never expands the book, and the voice bonus
    (``voice``, default :data:`VOICE_BONUS`; ``{}`` for none) that makes a request's tags audible
    with those signatures. ``bigrams`` (default :data:`SHIP_BIGRAMS`): also the book's word
    bigrams (:func:`book_bigrams`, under the key ``bigrams``), which keep a line from joining two
    words the book never joins. ``trigrams`` (default :data:`SHIP_TRIGRAMS`): also the word
    trigrams of the same lines (:class:`runtime.client.trigrams.TrigramTable`, under the key
    ``trigrams``), which refuse a line that strings three words together where the book never does.

    Returns what was written: ``{"bytes": file size, "bigrams": {"pairs", "starts", "bytes"},
    "trigrams": {"trigrams", "bytes", "false_positive_rate"}}`` (each of the last two only when
    written; ``bytes`` the key's share of the file)."""
    from dataclasses import replace

    from runtime.factory.linebook import book_constraints, load_line_book

    book = load_line_book()
    cons = replace(book_constraints(), vocabulary=tuple(book.vocabulary()),
                   signatures={tag: tuple(p) for tag, p in book.signatures().items()},
                   voice=dict(VOICE_BONUS if voice is None else voice) or None,
                   bigrams=book_bigrams(book) if (SHIP_BIGRAMS if bigrams is None else bigrams) else None,
                   trigrams=book_trigrams(book) if (SHIP_TRIGRAMS if trigrams is None else trigrams) else None)
    doc = cons.to_json()
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n"
    path.write_text(text)
    info: dict[str, Any] = {"bytes": len(text.encode("utf-8"))}
    if cons.bigrams is not None:
        table = cons.bigrams
        info["bigrams"] = {"pairs": len(table.successors), "starts": len(table.starts),
                           "bytes": len(json.dumps(doc["bigrams"], separators=(",", ":")))}
    if cons.trigrams is not None:
        info["trigrams"] = {"trigrams": cons.trigrams.n, "false_positive_rate": round(cons.trigrams.false_positive_rate, 4),
                            "bytes": len(json.dumps(doc["trigrams"], separators=(",", ":")))}
    return info


__all__ = ["EMBEDDINGS", "EXPORT_STAGES", "MAX_INT4_BYTES", "MOE_VARIANTS", "OPSET", "SHIP_BIGRAMS", "SHIP_TRIGRAMS", "VOICE_BONUS", "ExportError",
           "ExportOptions",
           "book_bigrams", "book_lines", "book_trigrams", "build_moe_block", "build_onnx", "export_checkpoint", "io_signature", "load_checkpoint",
           "quantize_pack_int4", "save_model", "unpack_int4", "write_constraints", "write_fallbacks"]
