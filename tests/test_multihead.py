"""split_heads / merge_heads and MultiHeadAttention against nn.MultiheadAttention."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from attention_course import (
    MultiHeadAttention,
    causal_mask,
    copy_weights_from_torch,
    merge_heads,
    split_heads,
    to_additive_mask,
    to_torch_mha_mask,
)

B, T, S, D, H = 2, 4, 6, 12, 3
KDIM, VDIM = 5, 7


def test_split_heads_cuts_each_tokens_features_into_slices():
    x = torch.randn(B, T, D)
    heads = split_heads(x, H)
    assert heads.shape == (B, H, T, D // H)
    for h in range(H):
        assert torch.equal(heads[:, h], x[:, :, h * 4 : (h + 1) * 4])
    assert torch.equal(merge_heads(heads), x)


def test_merge_heads_concatenates_heads_in_order():
    x = torch.randn(B, H, T, 5)
    merged = merge_heads(x)
    assert merged.shape == (B, T, H * 5)
    assert torch.equal(merged, torch.cat([x[:, h] for h in range(H)], dim=-1))
    assert torch.equal(split_heads(merged, H), x)


# --- parity with nn.MultiheadAttention ----------------------------------------------------


def make_pair(randomize, cross: bool, bias: bool = True, dropout: float = 0.0):
    kdim, vdim = (KDIM, VDIM) if cross else (None, None)
    theirs = nn.MultiheadAttention(
        D, H, dropout=dropout, bias=bias, kdim=kdim, vdim=vdim, batch_first=True
    )
    randomize(theirs.double())
    ours = MultiHeadAttention(D, H, dropout=dropout, bias=bias, kdim=kdim, vdim=vdim).double()
    copy_weights_from_torch(ours, theirs)
    return ours.eval(), theirs.eval()


def inputs(cross: bool, dtype=torch.float64):
    x = torch.randn(B, T, D, dtype=dtype)
    if not cross:
        return x, x, x
    return x, torch.randn(B, S, KDIM, dtype=dtype), torch.randn(B, S, VDIM, dtype=dtype)


def random_attend(shape):
    mask = torch.rand(shape) < 0.6
    mask[..., 0] = True  # no query is left without keys (PyTorch would give NaN)
    return mask


def masks_for(case: str, cross: bool):
    """(our mask, PyTorch's keyword arguments) for the same masking."""
    s = S if cross else T
    pad = torch.arange(s)[None, :] < torch.tensor([s, s - 2])[:, None]  # (B, s), True = real
    attn = random_attend((T, s)) if cross else causal_mask(T)
    per_head = random_attend((B, H, T, s))
    if case == "none":
        return None, {}
    if case == "padding":
        return pad[:, None, None, :], {"key_padding_mask": ~pad}
    if case == "attn (T, S)":
        return attn, {"attn_mask": to_torch_mha_mask(attn)}
    if case == "padding + attn":
        return attn & pad[:, None, None, :], {"key_padding_mask": ~pad, "attn_mask": ~attn}
    if case == "per head (B, H, T, S)":
        theirs = to_torch_mha_mask(per_head).reshape(B * H, T, s)  # PyTorch wants (B*H, T, S)
        return per_head, {"attn_mask": theirs}
    if case == "additive (T, S)":
        additive = to_additive_mask(attn, torch.float64)
        return additive, {"attn_mask": additive}
    raise AssertionError(case)


MASK_CASES = ["none", "padding", "attn (T, S)", "padding + attn", "per head (B, H, T, S)"]


@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("case", [*MASK_CASES, "additive (T, S)"])
def test_mha_matches_pytorch(randomize, cross, bias, case):
    ours, theirs = make_pair(randomize, cross, bias)
    query, key, value = inputs(cross)
    mask, kwargs = masks_for(case, cross)
    out, weights = ours(query, key, value, mask=mask)
    expected, expected_w = theirs(
        query, key, value, need_weights=True, average_attn_weights=False, **kwargs
    )
    assert out.shape == (B, T, D) and weights.shape == (B, H, T, key.shape[1])
    assert_close(out, expected)
    assert_close(weights, expected_w)  # per head, not averaged
    _, averaged = theirs(query, key, value, **kwargs)
    assert_close(weights.mean(dim=1), averaged)


@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize("case", MASK_CASES)
def test_mha_gradients_match_pytorch(randomize, cross, case):
    ours, theirs = make_pair(randomize, cross)
    query, key, value = (t.clone().requires_grad_() for t in inputs(cross))
    mask, kwargs = masks_for(case, cross)
    ours(query, key, value, mask=mask)[0].square().sum().backward()
    ours_grads = [t.grad.clone() for t in (query, key, value)]
    for t in (query, key, value):
        t.grad = None
    theirs(query, key, value, need_weights=False, **kwargs)[0].square().sum().backward()
    for mine, their in zip(ours_grads, (query.grad, key.grad, value.grad)):
        assert_close(mine, their)
    assert_close(ours.w_o.weight.grad, theirs.out_proj.weight.grad)


def test_mha_parameter_count_is_4_d_squared():
    d = 16
    assert sum(p.numel() for p in MultiHeadAttention(d, 4, bias=False).parameters()) == 4 * d * d
    assert sum(p.numel() for p in MultiHeadAttention(d, 4).parameters()) == 4 * d * d + 4 * d
    assert MultiHeadAttention(d, 4).d_head == 4


# --- the need_weights=False (fused) path --------------------------------------------------


def with_empty_rows(cross: bool):
    s = S if cross else T
    mask = random_attend((B, 1, T, s))
    mask[0, 0, 2] = False  # query 2 of batch 0 may attend to nothing
    return mask


@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize("case", [*MASK_CASES, "additive (T, S)", "empty rows", "empty additive"])
def test_mha_fused_path_gives_the_explicit_output(randomize, cross, case):
    ours, _ = make_pair(randomize, cross)
    query, key, value = inputs(cross)
    if case == "empty rows":
        mask = with_empty_rows(cross)
    elif case == "empty additive":
        mask = to_additive_mask(with_empty_rows(cross), torch.float64)
    else:
        mask, _ = masks_for(case, cross)
    explicit, weights = ours(query, key, value, mask=mask, need_weights=True)
    fused, none = ours(query, key, value, mask=mask, need_weights=False)
    assert none is None and weights is not None
    assert_close(fused, explicit)
    if case.startswith("empty"):
        # a query that sees nothing gets zero heads, so its output is w_o's bias alone
        assert_close(explicit[0, 2], ours.w_o.bias)
        assert bool((weights[0, :, 2] == 0).all())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_mha_float32_additive_mask_works_with_every_dtype(randomize, dtype):
    ours, _ = make_pair(randomize, cross=True)
    ours = ours.to(dtype)
    query, key, value = inputs(True, dtype=dtype)
    mask = with_empty_rows(True)
    float32_mask = to_additive_mask(mask, torch.float32)
    expected, _ = ours(query, key, value, mask=mask)
    tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(dtype, 1e-7)  # the fused kernel rounds
    for need_weights in (True, False):
        out, _ = ours(query, key, value, mask=float32_mask, need_weights=need_weights)
        assert out.dtype == dtype
        assert_close(out, expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_mha_fully_masked_rows_in_low_precision(randomize, dtype, kind, device):
    ours, _ = make_pair(randomize, cross=True, bias=False)
    ours = ours.to(device=device, dtype=dtype)
    query, key, value = (t.to(device) for t in inputs(True, dtype=dtype))
    bool_mask = with_empty_rows(True).to(device)
    mask = bool_mask if kind == "bool" else to_additive_mask(bool_mask, dtype)
    for need_weights in (True, False):
        out, _ = ours(query, key, value, mask=mask, need_weights=need_weights)
        assert out.dtype == dtype
        assert not bool(out.isnan().any())
        assert bool((out[0, 2] == 0).all())  # no bias: zero heads give a zero output
    reference, _ = ours.double()(*(t.double() for t in (query, key, value)), mask=bool_mask)
    tol = {torch.float16: 2e-2, torch.bfloat16: 1e-1}.get(dtype, 1e-4)
    assert_close(out.double(), reference, atol=tol, rtol=tol)


# --- properties ---------------------------------------------------------------------------


def test_mha_causal_mask_hides_the_future(randomize):
    ours, _ = make_pair(randomize, cross=False)
    x = torch.randn(B, T, D, dtype=torch.float64)
    out, _ = ours(x, x, x, mask=causal_mask(T))
    for t in range(T - 1):
        changed = x.clone()
        changed[:, t + 1 :] = torch.randn(B, T - t - 1, D, dtype=torch.float64)
        out2, _ = ours(changed, changed, changed, mask=causal_mask(T))
        assert_close(out2[:, : t + 1], out[:, : t + 1])
        assert not torch.allclose(out2[:, t + 1 :], out[:, t + 1 :])


@pytest.mark.parametrize("need_weights", [True, False])
def test_self_attention_without_positions_is_permutation_equivariant(randomize, need_weights):
    ours, _ = make_pair(randomize, cross=False)
    x = torch.randn(B, T, D, dtype=torch.float64)
    perm = torch.randperm(T)
    out, _ = ours(x, x, x, need_weights=need_weights)
    out_p, _ = ours(x[:, perm], x[:, perm], x[:, perm], need_weights=need_weights)
    assert_close(out_p, out[:, perm])


def test_cross_attention_ignores_the_order_of_key_value_pairs(randomize):
    ours, _ = make_pair(randomize, cross=True)
    query, key, value = inputs(True)
    perm = torch.randperm(S)
    out, weights = ours(query, key, value)
    out_p, weights_p = ours(query, key[:, perm], value[:, perm])
    assert_close(out_p, out)
    assert_close(weights_p, weights[..., perm])


def test_mha_weights_sum_to_one_over_keys(randomize):
    ours, _ = make_pair(randomize, cross=True)
    _, weights = ours(*inputs(True))
    assert_close(weights.sum(-1), torch.ones(B, H, T, dtype=torch.float64))


def test_mha_dropout_only_in_training(randomize):
    ours, theirs = make_pair(randomize, cross=False, dropout=0.5)
    plain, _ = make_pair(randomize, cross=False, dropout=0.0)
    x = torch.randn(B, T, D, dtype=torch.float64)
    assert_close(ours.eval()(x, x, x)[0], plain(x, x, x)[0])
    out, weights = ours.train()(x, x, x)
    assert not torch.allclose(out, plain(x, x, x)[0])
    assert bool((weights == 0).any())


def test_mha_follows_its_inputs_dtype_and_device(randomize, device):
    ours, _ = make_pair(randomize, cross=True)
    query, key, value = inputs(True)
    reference, _ = ours(query, key, value)
    for dtype in (torch.float32, torch.float64):
        moved = ours.to(device=device, dtype=dtype)
        out, weights = moved(*(t.to(device=device, dtype=dtype) for t in (query, key, value)))
        assert out.dtype == dtype and weights.dtype == dtype and out.device.type == device.type
        assert_close(out.cpu().double(), reference, atol=1e-4, rtol=1e-4)
