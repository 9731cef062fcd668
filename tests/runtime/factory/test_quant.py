import numpy as np
import pytest
import torch

from runtime.factory.quant import dequantize_int4, fake_quant_int4, quantize_int4


def numpy_int4_reference(w: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pinned formula, written independently: returns (q, scales, w_q)."""
    wb = w.astype(np.float32).reshape(*w.shape[:-1], w.shape[-1] // block, block)
    absmax = np.abs(wb).max(axis=-1, keepdims=True)
    scale = np.where(absmax == 0, np.float32(1.0), absmax / np.float32(7.0)).astype(np.float32)
    q = np.clip(np.round(wb / scale), -8, 7)
    return q.reshape(w.shape), scale[..., 0], (q * scale).reshape(w.shape).astype(np.float32)


def _weights(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(*shape, generator=g) * 0.05
    w[..., :32] *= 10  # blocks with very different ranges
    return w


@pytest.mark.parametrize("shape", [(64, 96), (3, 16, 64), (5, 32)])
def test_fake_quant_int4_matches_numpy_reference(shape):
    w = _weights(shape)
    _, _, ref = numpy_int4_reference(w.numpy(), 32)
    np.testing.assert_array_equal(fake_quant_int4(w, 32).numpy(), ref)


def test_quantize_int4_codes_and_scales_match_reference_and_dequantize_to_fake_quant():
    w = _weights((4, 8, 64), seed=1)
    q, scales = quantize_int4(w, 32)
    ref_q, ref_scales, _ = numpy_int4_reference(w.numpy(), 32)
    assert q.dtype == torch.int8 and scales.dtype == torch.float32
    assert scales.shape == (4, 8, 2)
    np.testing.assert_array_equal(q.numpy(), ref_q)
    np.testing.assert_array_equal(scales.numpy(), ref_scales)
    assert int(q.min()) >= -8 and int(q.max()) <= 7
    assert torch.equal(dequantize_int4(q, scales, 32), fake_quant_int4(w, 32))


def test_fake_quant_int4_is_idempotent():
    w = _weights((16, 128), seed=2)
    once = fake_quant_int4(w, 32)
    twice = fake_quant_int4(once, 32)
    torch.testing.assert_close(twice, once, rtol=1e-6, atol=0)


def test_each_block_keeps_its_absmax_and_uses_at_most_16_levels():
    w = _weights((8, 64), seed=3)
    wq = fake_quant_int4(w, 32)
    for blk, blk_q in zip(w.view(-1, 32), wq.view(-1, 32), strict=True):
        torch.testing.assert_close(blk_q.abs().max(), blk.abs().max())
        assert len(torch.unique(blk_q)) <= 16


def test_all_zero_block_stays_zero_with_unit_scale():
    w = torch.zeros(2, 64)
    w[1, 40] = 0.7
    _, scales = quantize_int4(w, 32)
    assert scales[0].tolist() == [1.0, 1.0] and scales[1, 0].item() == 1.0
    assert torch.count_nonzero(fake_quant_int4(w, 32)[0]) == 0


def test_fake_quant_int4_has_straight_through_gradient():
    w = _weights((4, 64), seed=4).requires_grad_()
    upstream = torch.randn(4, 64)
    (fake_quant_int4(w, 32) * upstream).sum().backward()
    torch.testing.assert_close(w.grad, upstream)


def test_fake_quant_int4_keeps_dtype():
    w = _weights((4, 64)).to(torch.bfloat16)
    assert fake_quant_int4(w, 32).dtype == torch.bfloat16


def test_last_dim_not_multiple_of_block_is_rejected_with_shape_in_message():
    with pytest.raises(ValueError, match=r"last dimension 48 .*\(4, 48\).*block size 32"):
        fake_quant_int4(torch.ones(4, 48), 32)
