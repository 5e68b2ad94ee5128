"""Masks: causal and padding masks, and conversion to PyTorch's conventions."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from attention_course import (
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
    to_additive_mask,
    to_torch_mha_mask,
)


@pytest.mark.parametrize("size", [1, 2, 5])
def test_causal_mask_is_true_on_and_below_the_diagonal(size):
    mask = causal_mask(size)
    assert mask.dtype == torch.bool and mask.shape == (size, size)
    for t in range(size):
        for s in range(size):
            assert bool(mask[t, s]) == (s <= t)
    pytorch = nn.Transformer.generate_square_subsequent_mask(size)  # 0 / -inf
    assert torch.equal(mask, ~pytorch.isinf())


@pytest.mark.parametrize("device", ["meta"] + (["cuda"] if torch.cuda.is_available() else []))
def test_causal_mask_on_a_device(device):
    """The "meta" device runs everywhere: a mask built on the CPU would not land there."""
    assert causal_mask(3, device=device).device.type == device
    assert causal_mask(3, device).device.type == device  # the contract's positional form
    assert causal_mask(2, device, S=5).device.type == device


@pytest.mark.parametrize("size, S", [(1, 1), (1, 4), (3, 7), (5, 5)])
def test_causal_mask_with_more_keys_is_the_last_rows_of_the_square_mask(size, S):
    """With S keys the size queries are the last ones, as when new tokens meet a KV cache."""
    assert torch.equal(causal_mask(size, S=S), causal_mask(S)[S - size :])


def test_causal_mask_rejects_fewer_keys_than_queries():
    with pytest.raises(ValueError, match=r"S: got 2, expected None or an int >= size=3"):
        causal_mask(3, S=2)


def test_padding_mask_is_true_at_real_tokens():
    lengths = torch.tensor([3, 0, 5, 1])
    mask = padding_mask(lengths, max_len=6)
    assert mask.dtype == torch.bool and mask.shape == (4, 6)
    for b, n in enumerate(lengths.tolist()):
        assert mask[b].tolist() == [s < n for s in range(6)]
    assert torch.equal(padding_mask(lengths), mask[:, :5])  # max_len defaults to max(lengths)
    assert torch.equal(padding_mask([3, 0, 5, 1], max_len=6), mask)  # a list works too


def test_padding_mask_masks_the_keys_of_sdpa():
    B, T, S, D = 3, 4, 5, 6
    q, k, v = torch.randn(B, 1, T, D), torch.randn(B, 1, S, D), torch.randn(B, 1, S, D)
    lengths = torch.tensor([5, 2, 4])
    mask = padding_mask(lengths)[:, None, None, :]  # (B, S) -> (B, 1, 1, S)
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    for b, n in enumerate(lengths.tolist()):
        assert bool((weights[b, ..., n:] == 0).all())
        alone, _ = scaled_dot_product_attention(q[b], k[b, :, :n], v[b, :, :n])
        assert_close(out[b], alone)  # padded keys change nothing


def test_to_torch_mha_mask_inverts_bool_and_keeps_float():
    mask = causal_mask(4)
    assert torch.equal(to_torch_mha_mask(mask), ~mask)
    additive = to_additive_mask(mask)
    assert to_torch_mha_mask(additive) is additive


def test_to_additive_mask_is_the_triu_minus_inf_form():
    additive = to_additive_mask(causal_mask(5))
    assert additive.dtype == torch.float32
    assert torch.equal(additive, nn.Transformer.generate_square_subsequent_mask(5))
    assert to_additive_mask(causal_mask(3), dtype=torch.float64).dtype == torch.float64


def test_bool_and_additive_masks_mean_the_same_in_pytorch_mha():
    """Our mask converted at the boundary gives nn.MultiheadAttention's result."""
    mha = nn.MultiheadAttention(8, 2, batch_first=True).double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    mask = causal_mask(5)
    ours_bool, _ = mha(x, x, x, attn_mask=to_torch_mha_mask(mask))
    ours_float, _ = mha(x, x, x, attn_mask=to_additive_mask(mask, dtype=torch.float64))
    theirs, _ = mha(x, x, x, is_causal=True, attn_mask=~mask)
    assert_close(ours_bool, theirs)
    assert_close(ours_float, theirs)
    q = x.view(2, 5, 2, 4).transpose(1, 2)  # a head-shaped view: both conventions agree in F.sdpa
    assert_close(
        F.scaled_dot_product_attention(q, q, q, attn_mask=mask),
        F.scaled_dot_product_attention(q, q, q, attn_mask=to_additive_mask(mask, torch.float64)),
    )
    assert math.isinf(to_additive_mask(mask)[0, 1].item())
