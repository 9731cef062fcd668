"""Shared helpers for the export / ONNX decoder tests: a tiny seeded Flash model and ORT feeds."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import torch

from runtime.factory.export import ExportOptions, build_onnx
from runtime.factory.model import Flash, FlashConfig


def tiny_config(**overrides: object) -> FlashConfig:
    base: dict[str, object] = dict(vocab_size=96, block_size=32, n_layer=2, n_head=2, n_embd=64,
                                   n_expert=4, expert_hidden=64, top_k=1, moe_every=1)
    base.update(overrides)
    return FlashConfig(**base)  # type: ignore[arg-type]


def tiny_model(cfg: FlashConfig | None = None, seed: int = 0) -> Flash:
    """A seeded tiny model whose weights are perturbed away from the init so routing varies."""
    torch.manual_seed(seed)
    model = Flash(cfg or tiny_config())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def build_session(model: Flash, **options: object) -> ort.InferenceSession:
    return session(build_onnx(model.state_dict(), model.config, ExportOptions(**options)))  # type: ignore[arg-type]


def feeds(cfg: FlashConfig, ids: np.ndarray, past: list[np.ndarray] | None = None,
          mask: np.ndarray | None = None, positions: np.ndarray | None = None) -> dict[str, np.ndarray]:
    b, t = ids.shape
    p = 0 if past is None else past[0].shape[2]
    hd = cfg.n_embd // cfg.n_head
    out = {
        "input_ids": ids.astype(np.int64),
        "position_ids": positions if positions is not None else np.tile(np.arange(p, p + t), (b, 1)),
        "attention_mask": mask if mask is not None else np.ones((b, p + t), np.int64),
    }
    for i in range(cfg.n_layer):
        empty = np.zeros((b, cfg.n_head, 0, hd), np.float32)
        out[f"past_key_{i}"] = past[2 * i] if past else empty
        out[f"past_value_{i}"] = past[2 * i + 1] if past else empty
    return out


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())
