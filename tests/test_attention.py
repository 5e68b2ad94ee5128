"""Soft/hard argmax, set attention, scaled dot-product attention (against
``F.scaled_dot_product_attention``), tiled attention and additive attention
(against its formula evaluated key by key)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from attention_course import (
    AdditiveAttention,
    hard_argmax,
    scaled_dot_product_attention,
    set_attention,
    soft_argmax,
    tiled_attention,
)

# Sizes that expose transposes: every axis has a different length.
B, H, T, S, DK, DV = 2, 3, 4, 6, 5, 7


def qkv(dtype=torch.float64, batch=(B, H), t=T, s=S, dk=DK, dv=DV, device="cpu"):
    q = torch.randn(*batch, t, dk, dtype=dtype, device=device)
    k = torch.randn(*batch, s, dk, dtype=dtype, device=device)
    v = torch.randn(*batch, s, dv, dtype=dtype, device=device)
    return q, k, v


def bool_mask(shape, p_keep=0.6):
    """Random boolean mask (True = attend) with key 0 always allowed: no empty rows."""
    mask = torch.rand(shape) < p_keep
    mask[..., 0] = True
    return mask


# --- soft and hard argmax -----------------------------------------------------------------


@pytest.mark.parametrize("beta", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_soft_argmax_is_softmax_of_beta_times_scores(beta, dim):
    scores = torch.randn(3, 4, 5, dtype=torch.float64)
    weights = soft_argmax(scores, beta=beta, dim=dim)
    assert_close(weights, torch.softmax(beta * scores, dim=dim))
    assert_close(weights.sum(dim), torch.ones_like(weights.sum(dim)))
    assert bool((weights > 0).all())


def test_soft_argmax_is_stable_for_huge_scores_and_uniform_at_beta_zero():
    scores = torch.tensor([[1e4, 2e4, -3e4], [5e30, 5e30, 0.0]])
    weights = soft_argmax(scores)
    assert bool(torch.isfinite(weights).all())
    assert_close(weights, torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0]]))
    uniform = soft_argmax(torch.randn(2, 5), beta=0.0)
    assert_close(uniform, torch.full((2, 5), 0.2))


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_hard_argmax_is_one_hot_at_the_argmax(dim):
    scores = torch.randn(3, 4, 5, dtype=torch.float64)
    weights = hard_argmax(scores, dim=dim)
    expected = F.one_hot(scores.argmax(dim), scores.shape[dim]).movedim(-1, dim)
    assert weights.dtype == scores.dtype
    assert_close(weights, expected.to(scores.dtype))
    assert_close(weights.sum(dim), torch.ones_like(weights.sum(dim)))


def test_hard_argmax_breaks_ties_like_argmax_and_follows_dtype():
    scores = torch.tensor([[2.0, 5.0, 5.0, 1.0]], dtype=torch.bfloat16)
    weights = hard_argmax(scores)
    assert weights.dtype == torch.bfloat16
    assert weights.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_hard_argmax_has_zero_gradient_and_soft_argmax_does_not():
    scores = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    probe = torch.randn(4, 6, dtype=torch.float64)  # a random linear read-out
    (hard_argmax(scores) * probe).sum().backward()
    assert scores.grad is not None
    assert_close(scores.grad, torch.zeros_like(scores))
    scores.grad = None
    (soft_argmax(scores) * probe).sum().backward()
    assert scores.grad.abs().max() > 1e-3


def test_soft_argmax_approaches_hard_argmax_as_beta_grows():
    scores = torch.randn(8, 10, dtype=torch.float64)
    hard = hard_argmax(scores)
    distances = [(soft_argmax(scores, beta=b) - hard).abs().max().item() for b in (1, 10, 100, 1e5)]
    assert all(a > b for a, b in zip(distances, distances[1:])), distances
    assert distances[-1] < 1e-8


# --- set attention ------------------------------------------------------------------------


@pytest.mark.parametrize("beta", [0.3, 1.0])
def test_set_attention_is_softmax_of_gram_matrix_times_x(beta):
    X = torch.randn(2, 5, 3, dtype=torch.float64)
    H_, A = set_attention(X, beta=beta)
    assert A.shape == (2, 5, 5) and H_.shape == X.shape
    assert_close(A, torch.softmax(beta * X @ X.transpose(-2, -1), dim=-1))
    assert_close(A.sum(-1), torch.ones(2, 5, dtype=torch.float64))  # rows: over the keys
    assert_close(H_, A @ X)


def test_set_attention_hard_picks_one_element_per_row():
    X = torch.randn(6, 4, dtype=torch.float64)
    H_, A = set_attention(X, hard=True)
    assert_close(A, F.one_hot((X @ X.T).argmax(-1), 6).double())
    assert_close(H_, A @ X)


@pytest.mark.parametrize("hard", [False, True])
def test_set_attention_is_permutation_equivariant(hard):
    X = torch.randn(7, 3, dtype=torch.float64)
    perm = torch.randperm(7)
    H_, A = set_attention(X, hard=hard)
    H_p, A_p = set_attention(X[perm], hard=hard)
    assert_close(H_p, H_[perm])  # permuting the set permutes the outputs alike
    assert_close(A_p, A[perm][:, perm])


# --- scaled dot-product attention vs F.scaled_dot_product_attention -----------------------


def additive_from(mask: torch.Tensor) -> torch.Tensor:
    # On the mask's device: a CPU tensor filled through a CUDA mask fails.
    zeros = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device)
    return zeros.masked_fill(~mask, -math.inf)


MASKS = {
    "none": lambda: None,
    "bool (T, S)": lambda: bool_mask((T, S)),
    "bool (B, 1, 1, S)": lambda: bool_mask((B, 1, 1, S)),
    "bool (B, H, T, S)": lambda: bool_mask((B, H, T, S)),
    "bool (1, H, 1, S)": lambda: bool_mask((1, H, 1, S)),
    "float (T, S)": lambda: additive_from(bool_mask((T, S))) + torch.randn(T, S).double(),
    "float (B, H, T, S)": lambda: additive_from(bool_mask((B, H, T, S))),
}


@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("scale", [None, 0.37])
def test_sdpa_matches_pytorch(mask_name, scale):
    q, k, v = qkv()
    mask = MASKS[mask_name]()
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    assert out.shape == (B, H, T, DV) and weights.shape == (B, H, T, S)
    assert_close(out, expected)


@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("scale", [None, 0.37])
def test_sdpa_weights_are_the_explicit_masked_softmax(mask_name, scale):
    q, k, v = qkv()
    mask = MASKS[mask_name]()
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(DK) if scale is None else scale)
    if mask is not None:
        scores = scores + (additive_from(mask) if mask.dtype == torch.bool else mask)
    assert_close(weights, torch.softmax(scores, dim=-1))
    assert_close(weights.sum(-1), torch.ones(B, H, T, dtype=torch.float64))  # over the keys
    assert_close(out, weights @ v)
    if mask is not None and mask.dtype == torch.bool:
        assert bool((weights[~mask.expand(B, H, T, S)] == 0).all())


def test_sdpa_default_scale_is_one_over_sqrt_dk():
    q, k, v = qkv()
    default, _ = scaled_dot_product_attention(q, k, v)
    explicit, _ = scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(DK))
    unscaled, _ = scaled_dot_product_attention(q, k, v, scale=1.0)
    assert_close(default, explicit)
    assert not torch.allclose(default, unscaled)


def test_sdpa_three_d_inputs_and_batch_broadcasting():
    q, k, v = qkv(batch=(B,))
    out, weights = scaled_dot_product_attention(q, k, v)
    assert_close(out, F.scaled_dot_product_attention(q, k, v))
    # one key/value set shared by every query batch: broadcast (1, S, .) against (B, T, .)
    out_shared, _ = scaled_dot_product_attention(q, k[:1], v[:1])
    expected = torch.stack([scaled_dot_product_attention(q[b], k[0], v[0])[0] for b in range(B)])
    assert_close(out_shared, expected)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_sdpa_float32_additive_mask_works_with_every_dtype(dtype):
    q, k, v = qkv(dtype=dtype)
    mask = bool_mask((T, S))
    out, weights = scaled_dot_product_attention(q, k, v, additive_from(mask).float())
    assert out.dtype == dtype and weights.dtype == dtype
    assert_close(out, scaled_dot_product_attention(q, k, v, mask)[0])


def test_sdpa_float16_scores_that_overflow_unscaled_stay_finite():
    # d_k = 64 entries of 32: q . k = 65536 is inf in float16 (largest finite: 65504), but
    # (q / sqrt(d_k)) . k = 8192 is not. Scaling after the product would give NaN weights.
    q = torch.full((1, 64), 32.0, dtype=torch.float16)  # (T=1, Dk)
    k = torch.stack([q[0], torch.zeros(64, dtype=torch.float16)])  # (S=2, Dk)
    v = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float16)  # (S, Dv)
    assert bool(torch.isinf(q @ k.T).any())  # the unscaled product really overflows
    out, weights = scaled_dot_product_attention(q, k, v)
    assert bool(torch.isfinite(out).all() and torch.isfinite(weights).all())
    assert weights.tolist() == [[1.0, 0.0]]
    assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert_close(tiled_attention(q, k, v, block_size=1), out)  # scales each query tile first
    expected = torch.softmax(q.float() @ k.float().T / 8, -1)  # the same scores in float32
    assert_close(weights.float(), expected)


def test_sdpa_dropout_output_uses_the_returned_weights():
    q, k, v = qkv()
    out, weights = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert_close(out, weights @ v)
    dropped = (weights == 0).double().mean().item()
    assert 0.3 < dropped < 0.7
    torch.manual_seed(1)
    again, _ = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(1)
    same, _ = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert_close(again, same)


# --- fully masked rows --------------------------------------------------------------------


LOW_AND_FULL = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def mask_with_empty_rows():
    mask = bool_mask((B, 1, T, S))
    mask[0, 0, 1] = False  # query 1 of batch 0 may attend to nothing
    mask[1, 0, -1] = False
    return mask


@pytest.mark.parametrize("dtype", LOW_AND_FULL)
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_sdpa_fully_masked_rows_give_zeros_not_nan(dtype, kind, device):
    q, k, v = qkv(dtype=dtype, device=device)
    mask = mask_with_empty_rows().to(device)
    given = mask if kind == "bool" else additive_from(mask).to(device=device, dtype=dtype)
    out, weights = scaled_dot_product_attention(q, k, v, mask=given)
    assert out.dtype == dtype and weights.dtype == dtype
    assert not bool(out.isnan().any() or weights.isnan().any())
    assert bool((out[0, :, 1] == 0).all() and (weights[0, :, 1] == 0).all())
    assert bool((out[1, :, -1] == 0).all())
    # the other rows match the float64 computation
    ref, _ = scaled_dot_product_attention(q.double(), k.double(), v.double(), mask=mask)
    tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(dtype, 1e-5)
    assert_close(out.double(), ref, atol=tol, rtol=tol)


def test_sdpa_gradients_stay_finite_with_fully_masked_rows():
    q, k, v = (t.requires_grad_() for t in qkv())
    out, _ = scaled_dot_product_attention(q, k, v, mask=mask_with_empty_rows())
    out.square().sum().backward()
    for t in (q, k, v):
        assert bool(torch.isfinite(t.grad).all())
    assert bool((q.grad[0, :, 1] == 0).all())  # a query that sees nothing learns nothing


# --- tiled attention ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "t, s, block, mask_name",
    [(T, S, 4, "none"), (9, 13, 4, "bool (B, 1, 1, S)"), (5, 7, 3, "float (B, H, T, S)")],
)
def test_tiled_attention_matches_pytorch(t, s, block, mask_name):
    q, k, v = qkv(t=t, s=s)
    mask = None
    if mask_name.startswith("bool"):
        mask = bool_mask((B, 1, 1, s))
    elif mask_name.startswith("float"):
        mask = additive_from(bool_mask((B, H, t, s)))
    out = tiled_attention(q, k, v, mask=mask, block_size=block)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


@pytest.mark.parametrize("dtype", LOW_AND_FULL)
def test_tiled_attention_fully_masked_rows_give_zeros(dtype, device):
    q, k, v = qkv(dtype=dtype, device=device)
    mask = mask_with_empty_rows().to(device)
    out = tiled_attention(q, k, v, mask=mask, block_size=2)
    ref, _ = scaled_dot_product_attention(q, k, v, mask=mask)
    assert out.dtype == dtype and not bool(out.isnan().any())
    assert bool((out[0, :, 1] == 0).all())
    tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(dtype, 1e-5)
    assert_close(out, ref, atol=tol, rtol=tol)


# --- additive attention -------------------------------------------------------------------


def additive_by_loop(module, query, keys, values, mask):
    """e_ij = v . tanh(W q_i + U k_j), softmax over the allowed j, c_i = sum_j a_ij v_j."""
    W, U, v = module.W.weight, module.U.weight, module.v.weight[0]
    Bq, Tq = query.shape[:2]
    contexts = torch.zeros(Bq, Tq, values.shape[-1], dtype=query.dtype)
    weights = torch.zeros(Bq, Tq, keys.shape[1], dtype=query.dtype)
    for b in range(Bq):
        for i in range(Tq):
            scores = [
                v @ torch.tanh(W @ query[b, i] + U @ keys[b, j]) for j in range(keys.shape[1])
            ]
            scores = torch.stack(scores)
            allowed = mask[b, i] if mask is not None else torch.ones_like(scores, dtype=torch.bool)
            alpha = torch.zeros_like(scores)
            alpha[allowed] = torch.softmax(scores[allowed], dim=0)
            weights[b, i] = alpha
            contexts[b, i] = sum(alpha[j] * values[b, j] for j in range(keys.shape[1]))
    return contexts, weights


@pytest.mark.parametrize("query_rank", [2, 3])
@pytest.mark.parametrize("masked", [False, True])
def test_additive_attention_matches_the_formula_key_by_key(query_rank, masked):
    Dq, Dk, Dv, hidden = 3, 4, 5, 6
    module = AdditiveAttention(Dq, Dk, hidden).double()
    query = torch.randn(B, Dq) if query_rank == 2 else torch.randn(B, T, Dq)
    query = query.double()
    keys, values = torch.randn(B, S, Dk).double(), torch.randn(B, S, Dv).double()
    mask = None
    if masked:
        mask = bool_mask((B, S)) if query_rank == 2 else bool_mask((B, T, S))
    context, weights = module(query, keys, values, mask=mask)
    q3 = query[:, None] if query_rank == 2 else query
    m3 = None if mask is None else (mask[:, None] if query_rank == 2 else mask)
    exp_context, exp_weights = additive_by_loop(module, q3, keys, values, m3)
    if query_rank == 2:
        exp_context, exp_weights = exp_context[:, 0], exp_weights[:, 0]
    assert context.shape == exp_context.shape and weights.shape == exp_weights.shape
    assert_close(weights, exp_weights)
    assert_close(context, exp_context)


def test_additive_attention_broadcast_mask_and_empty_rows():
    module = AdditiveAttention(3, 4, 6)
    query, keys, values = torch.randn(B, T, 3), torch.randn(B, S, 4), torch.randn(B, S, 2)
    lengths = torch.tensor([S - 2, 0])  # batch 1 has no keys at all
    key_mask = torch.arange(S)[None, :] < lengths[:, None]  # (B, S)
    context, weights = module(query, keys, values, mask=key_mask[:, None, :])  # (B, 1, S)
    assert not bool(context.isnan().any())
    assert bool((weights[0, :, S - 2 :] == 0).all())
    assert_close(weights[0].sum(-1), torch.ones(T))
    assert bool((context[1] == 0).all() and (weights[1] == 0).all())


def test_additive_attention_follows_dtype_and_gradients_flow():
    module = AdditiveAttention(3, 4, 6).double()
    query = torch.randn(B, 3, dtype=torch.float64, requires_grad=True)
    keys = torch.randn(B, S, 4, dtype=torch.float64)
    context, weights = module(query, keys, keys)
    assert context.dtype == torch.float64 and weights.dtype == torch.float64
    context.sum().backward()
    for p in (query, module.W.weight, module.U.weight, module.v.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_set_attention_equals_torch_sdpa_with_scale_beta():
    """Soft set attention is self-attention with Q = K = V = X and scale beta."""
    X = torch.randn(3, 6, 5, dtype=torch.float64)
    for beta in (0.3, 1.0, 2.5):
        H, A = set_attention(X, beta=beta)
        torch.testing.assert_close(H, F.scaled_dot_product_attention(X, X, X, scale=beta))
        torch.testing.assert_close(A.sum(-1), torch.ones(3, 6, dtype=torch.float64))
