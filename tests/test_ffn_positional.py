"""The position-wise feed-forward network and the positional encodings."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from attention_course import (
    LearnedPositionalEmbedding,
    PositionalEncoding,
    PositionwiseFeedForward,
    sinusoidal_positional_encoding,
)

# --- feed-forward -------------------------------------------------------------------------


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_ffn_is_linear_activation_linear(randomize, activation):
    ffn = randomize(PositionwiseFeedForward(6, 10, activation=activation).double())
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    act = F.relu if activation == "relu" else F.gelu
    w1, b1 = ffn.linear1.weight, ffn.linear1.bias
    w2, b2 = ffn.linear2.weight, ffn.linear2.bias
    assert_close(ffn(x), act(x @ w1.T + b1) @ w2.T + b2)


def test_ffn_acts_on_every_position_alone(randomize):
    ffn = randomize(PositionwiseFeedForward(6, 10).double())
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    y = ffn(x)
    for t in range(5):
        assert_close(ffn(x[:, t]), y[:, t])  # one token at a time: same result
    perm = torch.randperm(5)
    assert_close(ffn(x[:, perm]), y[:, perm])


def test_ffn_parameter_count_is_8_d_squared():
    d = 16
    ffn = PositionwiseFeedForward(d, 4 * d)
    assert sum(p.numel() for p in ffn.parameters() if p.dim() > 1) == 8 * d * d
    assert sum(p.numel() for p in ffn.parameters()) == 8 * d * d + 4 * d + d


def test_ffn_dropout_only_in_training(randomize):
    ffn = randomize(PositionwiseFeedForward(6, 50, dropout=0.5).double())
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    w1, b1, w2, b2 = ffn.linear1.weight, ffn.linear1.bias, ffn.linear2.weight, ffn.linear2.bias
    assert_close(ffn.eval()(x), F.relu(x @ w1.T + b1) @ w2.T + b2)
    assert not torch.allclose(ffn.train()(x), ffn.eval()(x))


# Devices other than the CPU: "meta" (shapes and dtypes only, no data) runs everywhere, so
# a tensor created on the CPU inside the module would fail this test on any machine.
OTHER_DEVICES = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", OTHER_DEVICES)
def test_ffn_follows_dtype_and_device(device):
    ffn = PositionwiseFeedForward(6, 10).to(device=device, dtype=torch.float64)
    y = ffn(torch.randn(2, 5, 6, dtype=torch.float64, device=device))
    assert y.dtype == torch.float64 and y.device.type == device and y.shape == (2, 5, 6)


# --- sinusoidal positional encoding -------------------------------------------------------


@pytest.mark.parametrize("max_len, d_model", [(12, 8), (7, 5), (3, 1), (50, 33)])
def test_sinusoidal_encoding_is_the_formula(max_len, d_model):
    pe = sinusoidal_positional_encoding(max_len, d_model, dtype=torch.float64)
    assert pe.shape == (max_len, d_model) and pe.dtype == torch.float64
    for p in range(max_len):
        for j in range(d_model):
            i = j // 2  # column pair i holds sin and cos of the same angle
            angle = p / 10000 ** (2 * i / d_model)
            expected = math.sin(angle) if j % 2 == 0 else math.cos(angle)
            assert abs(pe[p, j].item() - expected) < 1e-12, (p, j)
    assert bool((pe.abs() <= 1).all())


def test_sinusoidal_encoding_stays_in_range_and_follows_dtype():
    pe = sinusoidal_positional_encoding(1000, 64)
    assert pe.dtype == torch.get_default_dtype()
    assert bool((pe >= -1).all() and (pe <= 1).all())
    assert pe[:, 0].max() > 0.99 and pe[:, 0].min() < -0.99  # the fastest pair spans [-1, 1]
    assert sinusoidal_positional_encoding(4, 6, dtype=torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize("k", [1, 3, 10])
def test_shifting_positions_is_a_fixed_block_rotation(k):
    """PE(p + k) = R_k PE(p) for every p, with R_k block diagonal of 2x2 rotations."""
    max_len, d = 40, 16
    pe = sinusoidal_positional_encoding(max_len, d, dtype=torch.float64)
    R = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        w = 1 / 10000 ** (2 * i / d)
        c, s = math.cos(w * k), math.sin(w * k)
        # [sin(a + b), cos(a + b)] = [[cos b, sin b], [-sin b, cos b]] @ [sin a, cos a]
        R[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, s], [-s, c]])
    assert_close(pe[k:], pe[:-k] @ R.T)  # one matrix for every position p
    assert_close(R @ R.T, torch.eye(d, dtype=torch.float64))  # a rotation: lengths kept
    # hence PE(p) . PE(p + k) does not depend on p
    dots = (pe[:-k] * pe[k:]).sum(-1)
    assert_close(dots, torch.full_like(dots, dots[0].item()))


def test_positional_encoding_adds_the_table(device):
    module = PositionalEncoding(6, max_len=20).to(device)
    x = torch.randn(2, 5, 6, device=device)
    table = sinusoidal_positional_encoding(20, 6).to(device)
    assert_close(module(x), x + table[:5])
    assert_close(module(x, start=7), x + table[7:12])
    assert "pe" not in module.state_dict()  # a formula, not a parameter
    y = module.double()(x.double())
    assert y.dtype == torch.float64 and y.device.type == device.type


def test_positional_encoding_dropout_only_in_training():
    module = PositionalEncoding(6, max_len=20, dropout=0.5)
    x = torch.randn(2, 5, 6)
    assert_close(module.eval()(x), x + sinusoidal_positional_encoding(20, 6)[:5])
    assert bool((module.train()(x) == 0).any())


def test_learned_positional_embedding_adds_one_vector_per_position():
    module = LearnedPositionalEmbedding(6, max_len=20)
    x = torch.randn(2, 5, 6)
    assert_close(module(x), x + module.embedding.weight[:5])
    assert_close(module(x, start=3), x + module.embedding.weight[3:8])
    assert sum(p.numel() for p in module.parameters()) == 20 * 6
    (module(x) ** 2).sum().backward()
    grad = module.embedding.weight.grad
    assert grad[:5].abs().sum() > 0 and bool((grad[5:] == 0).all())  # unused rows learn nothing


def test_count_parameters_counts_all_or_only_weight_matrices():
    from torch import nn

    from attention_course import count_parameters

    d = 16
    ffn = PositionwiseFeedForward(d, 4 * d)
    assert count_parameters(ffn) == 8 * d * d + 4 * d + d
    assert count_parameters(ffn, weights_only=True) == 8 * d * d
    assert count_parameters(nn.LayerNorm(d), weights_only=True) == 0
    with pytest.raises(ValueError, match="module"):
        count_parameters("not a module")
