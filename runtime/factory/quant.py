"""INT4 block quantization shared by quantization-aware training and export.

One formula, used in both places so the exported INT4 model computes exactly the
weights the model was fine-tuned with:

    blocks of ``block`` consecutive values along the LAST (input, K) dimension
    scale = absmax(block) / 7          (scale = 1 where absmax == 0)
    q     = clamp(round(w / scale), -8, 7)      round = half to even
    w_q   = q * scale

Export stores ``q + 8`` as unsigned 4-bit values (zero point 8) with the same
float32 scales, which ``MatMulNBits`` and ``QMoE`` dequantize back to ``w_q``.
"""

from __future__ import annotations

import torch
from torch import Tensor

INT4_MIN = -8
INT4_MAX = 7


def _blocked(w: Tensor, block: int) -> Tensor:
    """View ``w`` (float32) as [..., K // block, block]; K must be a multiple of ``block``."""
    if block <= 0:
        raise ValueError(f"quant block size must be positive, got {block}")
    if w.dim() == 0:
        raise ValueError("cannot block-quantize a scalar")
    k = w.shape[-1]
    if k % block != 0:
        raise ValueError(
            f"last dimension {k} of weight with shape {tuple(w.shape)} is not a multiple of "
            f"the quant block size {block}"
        )
    return w.reshape(*w.shape[:-1], k // block, block)


def quantize_int4(w: Tensor, block: int = 32) -> tuple[Tensor, Tensor]:
    """Quantize ``w`` to signed INT4 codes and per-block scales.

    Returns ``(q, scales)``: ``q`` is int8 with the shape of ``w`` and values in
    [-8, 7]; ``scales`` is float32 of shape ``(*w.shape[:-1], K // block)``.
    """
    wb = _blocked(w.detach().float(), block)
    absmax = wb.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(absmax == 0, torch.ones_like(absmax), absmax / 7.0)
    q = torch.clamp(torch.round(wb / scale), INT4_MIN, INT4_MAX)
    return q.to(torch.int8).reshape(w.shape), scale.squeeze(-1)


def dequantize_int4(q: Tensor, scales: Tensor, block: int = 32) -> Tensor:
    """Inverse of :func:`quantize_int4`: float32 ``q * scale`` with the shape of ``q``."""
    qb = _blocked(q.float(), block)
    if scales.shape != qb.shape[:-1]:
        raise ValueError(
            f"scales shape {tuple(scales.shape)} does not match codes {tuple(q.shape)} "
            f"with block {block} (expected {tuple(qb.shape[:-1])})"
        )
    return (qb * scales.float().unsqueeze(-1)).reshape(q.shape)


def fake_quant_int4(w: Tensor, block: int = 32) -> Tensor:
    """Return ``w`` rounded to its INT4 block-quantized value, with a straight-through gradient.

    The forward value is exactly ``dequantize_int4(*quantize_int4(w, block), block)``
    (cast back to ``w.dtype``); the backward pass treats the rounding as the identity,
    so the gradient reaching ``w`` is the gradient of the quantized weight.
    """
    wb = _blocked(w.float(), block)
    absmax = wb.detach().abs().amax(dim=-1, keepdim=True)
    scale = torch.where(absmax == 0, torch.ones_like(absmax), absmax / 7.0)
    wq = torch.clamp(torch.round(wb.detach() / scale), INT4_MIN, INT4_MAX) * scale
    # wq + (wb - wb) is exactly wq in the forward pass (wb + (wq - wb) would not always be)
    out = wq + (wb - wb.detach())
    return out.reshape(w.shape).to(w.dtype)
