"""Buggy soft-argmax, set attention, scaled dot-product and additive attention."""

import math

import torch
from torch import nn

# ---------------------------------------------------------------- soft_argmax


def soft_argmax_no_max_shift(scores, beta=1.0, dim=-1):
    """Exponentiates the raw scores: exp(1e4) overflows to inf, and inf / inf is NaN."""
    e = torch.exp(beta * scores)
    return e / e.sum(dim=dim, keepdim=True)


def soft_argmax_ignores_dim(scores, beta=1.0, dim=-1):
    """Always normalises over the last axis, whatever `dim` says."""
    return torch.softmax(beta * scores, dim=-1)


def soft_argmax_divides_by_beta(scores, beta=1.0, dim=-1):
    """Treats beta as a temperature and divides by it."""
    return torch.softmax(scores / beta, dim=dim)


def soft_argmax_ignores_beta(scores, beta=1.0, dim=-1):
    """Forgets the inverse temperature altogether."""
    return torch.softmax(scores, dim=dim)


def soft_argmax_in_place_shift(scores, beta=1.0, dim=-1):
    """Subtracts the max in place, changing the caller's tensor."""
    scores -= scores.max(dim=dim, keepdim=True).values
    e = torch.exp(beta * scores)
    return e / e.sum(dim=dim, keepdim=True)


# ---------------------------------------------------------------- set_attention


def set_attention_columns(X, beta=1.0, hard=False):
    """Softmax over dim=-2: the columns of A sum to 1 instead of the rows."""
    scores = X @ X.transpose(-2, -1)
    A = torch.softmax(beta * scores, dim=-2)
    return A @ X, A


def set_attention_transposed_product(X, beta=1.0, hard=False):
    """Computes H = A^T X (the notes' column form H = X A read the wrong way)."""
    scores = X @ X.transpose(-2, -1)
    if hard:
        A = torch.nn.functional.one_hot(scores.argmax(-1), scores.shape[-1]).to(X.dtype)
    else:
        A = torch.softmax(beta * scores, dim=-1)
    return A.transpose(-2, -1) @ X, A


def set_attention_ignores_hard(X, beta=1.0, hard=False):
    """Always uses the softmax, even when hard=True asks for a one-hot argmax."""
    A = torch.softmax(beta * (X @ X.transpose(-2, -1)), dim=-1)
    return A @ X, A


def set_attention_scaled(X, beta=1.0, hard=False):
    """Borrows the 1/sqrt(n) of scaled dot-product attention."""
    scores = X @ X.transpose(-2, -1) / math.sqrt(X.shape[-1])
    if hard:
        A = torch.nn.functional.one_hot(scores.argmax(-1), scores.shape[-1]).to(X.dtype)
    else:
        A = torch.softmax(beta * scores, dim=-1)
    return A @ X, A


def set_attention_swapped_returns(X, beta=1.0, hard=False):
    """Returns (A, H) instead of (H, A)."""
    A = torch.softmax(beta * (X @ X.transpose(-2, -1)), dim=-1)
    return A, A @ X


# ---------------------------------------------------------------- scaled dot-product


def _masked(scores, mask):
    if mask is None:
        return scores
    if mask.dtype == torch.bool:
        return scores.masked_fill(~mask, float("-inf"))
    return scores + mask


def _safe_softmax(scores):
    return torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)


def sdpa_no_scaling(query, key, value, mask=None, dropout_p=0.0, scale=None):
    """Forgets to divide the scores by sqrt(d_k)."""
    scores = query @ key.transpose(-2, -1)
    weights = _safe_softmax(_masked(scores, mask))
    return weights @ value, weights


def sdpa_scales_by_model_width(query, key, value, mask=None, dropout_p=0.0, scale=None):
    """Scales 4-D (B, H, T, d_k) scores by 1/sqrt(H * d_k), the model's width."""
    heads = query.shape[-3] if query.dim() == 4 else 1
    scores = query @ key.transpose(-2, -1) / math.sqrt(heads * query.shape[-1])
    weights = _safe_softmax(_masked(scores, mask))
    return weights @ value, weights


def sdpa_scales_by_length(query, key, value, mask=None, dropout_p=0.0, scale=None):
    """Scales by 1/sqrt(T), the number of queries."""
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-2])
    weights = _safe_softmax(_masked(scores, mask))
    return weights @ value, weights


def sdpa_squeezes_batch(query, key, value, mask=None, dropout_p=0.0, scale=None):
    """Right, but `.squeeze(0)`s the result: a batch of one loses its batch axis."""
    import attention_course as ac

    out, weights = ac.scaled_dot_product_attention(query, key, value, mask, dropout_p, scale)
    return out.squeeze(0), weights.squeeze(0)


def sdpa_divides_by_dk(query, key, value, mask=None, dropout_p=0.0, scale=None):
    """Divides by d_k instead of sqrt(d_k)."""
    scale = 1.0 / query.shape[-1] if scale is None else scale
    weights = _safe_softmax(_masked(query @ key.transpose(-2, -1) * scale, mask))
    return weights @ value, weights


def sdpa_softmax_over_queries(query, key, value, mask=None, dropout_p=0.0, scale=None):
    """Softmax over dim=-2 (the queries) instead of the keys."""
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = _masked(query @ key.transpose(-2, -1) * scale, mask)
    weights = torch.nan_to_num(torch.softmax(scores, dim=-2), nan=0.0)
    return weights @ value, weights


def sdpa_inverted_mask(query, key, value, mask=None, dropout_p=0.0, scale=None):
    """Uses nn.MultiheadAttention's convention: fills where the mask is True."""
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = query @ key.transpose(-2, -1) * scale
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(mask, float("-inf"))
    elif mask is not None:
        scores = scores + mask
    weights = _safe_softmax(scores)
    return weights @ value, weights


def sdpa_mask_after_softmax(query, key, value, mask=None, dropout_p=0.0, scale=None):
    """Zeroes the masked weights after the softmax, so rows no longer sum to 1."""
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = query @ key.transpose(-2, -1) * scale
    if mask is not None and mask.dtype != torch.bool:
        scores = scores + mask
    weights = torch.softmax(scores, dim=-1)
    if mask is not None and mask.dtype == torch.bool:
        weights = weights * mask
    return weights @ value, weights


def sdpa_nan_rows(query, key, value, mask=None, dropout_p=0.0, scale=None):
    """Fills with -inf and never handles a query whose keys are all masked (NaN)."""
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    weights = torch.softmax(_masked(query @ key.transpose(-2, -1) * scale, mask), dim=-1)
    return weights @ value, weights


def sdpa_ignores_scale(query, key, value, mask=None, dropout_p=0.0, scale=None):
    """Always uses 1/sqrt(d_k), even when a `scale` is given."""
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    weights = _safe_softmax(_masked(scores, mask))
    return weights @ value, weights


def sdpa_scales_by_dv(query, key, value, mask=None, dropout_p=0.0, scale=None):
    """Takes the width from the values: 1/sqrt(d_v) instead of 1/sqrt(d_k)."""
    scale = 1.0 / math.sqrt(value.shape[-1]) if scale is None else scale
    weights = _safe_softmax(_masked(query @ key.transpose(-2, -1) * scale, mask))
    return weights @ value, weights


def sdpa_large_negative_fill(query, key, value, mask=None, dropout_p=0.0, scale=None):
    """Fills masked scores with -1e9: a fully masked row becomes uniform, not zero."""
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = query @ key.transpose(-2, -1) * scale
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, -1e9)
    elif mask is not None:
        scores = scores + mask
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def _correct_weights(query, key, value, mask, scale):
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    return _safe_softmax(_masked(query @ key.transpose(-2, -1) * scale, mask))


def sdpa_ignores_dropout(query, key, value, mask=None, dropout_p=0.0, scale=None):
    """Never applies dropout, whatever `dropout_p` says."""
    weights = _correct_weights(query, key, value, mask, scale)
    return weights @ value, weights


def sdpa_returns_weights_before_dropout(query, key, value, mask=None, dropout_p=0.0, scale=None):
    """Drops out the weights for the output, but returns the weights from before dropout."""
    weights = _correct_weights(query, key, value, mask, scale)
    dropped = torch.nn.functional.dropout(weights, p=dropout_p, training=True)
    return dropped @ value, weights


def sdpa_dropout_not_rescaled(query, key, value, mask=None, dropout_p=0.0, scale=None):
    """Zeroes weights with a random mask but forgets to scale the survivors by 1/(1 - p)."""
    weights = _correct_weights(query, key, value, mask, scale)
    if dropout_p > 0:
        weights = weights * (torch.rand_like(weights) >= dropout_p)
    return weights @ value, weights


def sdpa_dropout_keep_probability(query, key, value, mask=None, dropout_p=0.0, scale=None):
    """Passes 1 - dropout_p to F.dropout, as if p were the probability of keeping."""
    weights = _correct_weights(query, key, value, mask, scale)
    if dropout_p > 0:
        weights = torch.nn.functional.dropout(weights, p=1 - dropout_p, training=True)
    return weights @ value, weights


def sdpa_float_mask_as_bool(query, key, value, mask=None, dropout_p=0.0, scale=None):
    """Converts a float mask to bool with `mask == 0`: right for 0 / -inf, wrong for a bias."""
    if mask is not None and mask.dtype != torch.bool:
        mask = mask == 0
    return _correct(query, key, value, mask, dropout_p, scale)


def sdpa_scale_falsy(query, key, value, mask=None, dropout_p=0.0, scale=None):
    """`scale = scale or 1/sqrt(d_k)`: scale=0.0 is falsy and gets replaced."""
    scale = scale or 1.0 / math.sqrt(query.shape[-1])
    return _correct(query, key, value, mask, dropout_p, scale)


def sdpa_multiplies_bool_mask(query, key, value, mask=None, dropout_p=0.0, scale=None):
    """Multiplies the scores by the bool mask: masked scores become 0, not -inf."""
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = query @ key.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores * mask if mask.dtype == torch.bool else scores + mask
    weights = _safe_softmax(scores)
    return weights @ value, weights


def _correct(query, key, value, mask, dropout_p, scale):
    weights = _correct_weights(query, key, value, mask, scale)
    if dropout_p > 0:
        weights = torch.nn.functional.dropout(weights, p=dropout_p, training=True)
    return weights @ value, weights


# ---------------------------------------------------------------- additive attention


class _AdditiveBase(nn.Module):
    def __init__(self, query_dim, key_dim, hidden_dim):
        super().__init__()
        self.W = nn.Linear(query_dim, hidden_dim, bias=False)
        self.U = nn.Linear(key_dim, hidden_dim, bias=False)
        self.v = nn.Linear(hidden_dim, 1, bias=False)

    def scores(self, q, keys):
        return self.v(torch.tanh(self.W(q)[:, :, None, :] + self.U(keys)[:, None, :, :]))[..., 0]

    def forward(self, query, keys, values, mask=None):
        single = query.dim() == 2
        q = query[:, None, :] if single else query
        if mask is not None and single:
            mask = mask[:, None, :]
        scores = self.scores(q, keys)
        weights = self.normalise(scores, mask)
        context = weights @ values
        if single:
            return context[:, 0], weights[:, 0]
        return context, weights

    def normalise(self, scores, mask):
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)


class AdditiveNoTanh(_AdditiveBase):
    """Forgets the tanh: the score becomes linear in q and k."""

    def scores(self, q, keys):
        return self.v(self.W(q)[:, :, None, :] + self.U(keys)[:, None, :, :])[..., 0]


class AdditiveWrongNames(nn.Module):
    """Names its layers W_q / W_k / w_v, so the reference weights cannot be loaded."""

    def __init__(self, query_dim, key_dim, hidden_dim):
        super().__init__()
        self.W_q = nn.Linear(query_dim, hidden_dim, bias=False)
        self.W_k = nn.Linear(key_dim, hidden_dim, bias=False)
        self.w_v = nn.Linear(hidden_dim, 1, bias=False)

    def forward(self, query, keys, values, mask=None):
        q = query[:, None, :] if query.dim() == 2 else query
        scores = self.w_v(torch.tanh(self.W_q(q)[:, :, None] + self.W_k(keys)[:, None]))[..., 0]
        weights = torch.softmax(scores, dim=-1)
        context = weights @ values
        return (context[:, 0], weights[:, 0]) if query.dim() == 2 else (context, weights)


class AdditiveInvertedMask(_AdditiveBase):
    """Masks the positions where the mask is True (the real tokens)."""

    def normalise(self, scores, mask):
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        return torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)


class AdditiveSoftmaxOverQueries(_AdditiveBase):
    """Normalises the (B, T, S) scores over dim=1, the queries."""

    def normalise(self, scores, mask):
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.nan_to_num(torch.softmax(scores, dim=1), nan=0.0)


class AdditiveKeepsQueryAxis(_AdditiveBase):
    """Returns (B, 1, Dv) and (B, 1, S) for a single query instead of dropping the axis."""

    def forward(self, query, keys, values, mask=None):
        q = query[:, None, :] if query.dim() == 2 else query
        if mask is not None and query.dim() == 2:
            mask = mask[:, None, :]
        weights = self.normalise(self.scores(q, keys), mask)
        return weights @ values, weights


class AdditiveDetachedWeights(_AdditiveBase):
    """Returns `weights.detach()`: the context is right, but no gradient flows through the
    returned weights."""

    def forward(self, query, keys, values, mask=None):
        context, weights = super().forward(query, keys, values, mask)
        return context, weights.detach()


class AdditiveMaskNotUnsqueezed(_AdditiveBase):
    """With a single query (B, Dq) forgets to give the (B, S) mask the query axis."""

    def forward(self, query, keys, values, mask=None):
        single = query.dim() == 2
        q = query[:, None, :] if single else query
        weights = self.normalise(self.scores(q, keys), mask)
        context = weights @ values
        return (context[:, 0], weights[:, 0]) if single else (context, weights)


class AdditiveSqueezeAll(_AdditiveBase):
    """Calls `.squeeze()` with no dim, which also drops the axis of a single query."""

    def scores(self, q, keys):
        return self.v(torch.tanh(self.W(q)[:, :, None, :] + self.U(keys)[:, None, :, :])).squeeze()

    def forward(self, query, keys, values, mask=None):
        q = query[:, None, :] if query.dim() == 2 else query
        if mask is not None and query.dim() == 2:
            mask = mask[:, None, :]
        weights = self.normalise(self.scores(q, keys), mask)
        return weights @ values, weights


CATALOGUE = [
    ("soft_argmax", "no max shift", soft_argmax_no_max_shift, "subtract the max"),
    ("soft_argmax", "ignores dim", soft_argmax_ignores_dim, "ignored `dim`"),
    ("soft_argmax", "divides by beta", soft_argmax_divides_by_beta, "divided the scores by beta"),
    ("soft_argmax", "ignores beta", soft_argmax_ignores_beta, "`beta` is ignored"),
    ("soft_argmax", "in-place shift", soft_argmax_in_place_shift, "in place"),
    ("set_attention", "softmax over columns", set_attention_columns, "dim=-2"),
    ("set_attention", "A^T X", set_attention_transposed_product, "A^T @ X"),
    ("set_attention", "ignores hard", set_attention_ignores_hard, "`hard=True` is ignored"),
    ("set_attention", "scaled by sqrt(n)", set_attention_scaled, "1/sqrt(n)"),
    ("set_attention", "returns (A, H)", set_attention_swapped_returns, "wrong order"),
    (
        "scaled_dot_product_attention",
        "no scaling",
        sdpa_no_scaling,
        "scale-missing",
    ),
    ("scaled_dot_product_attention", "divides by d_k", sdpa_divides_by_dk, "scale-by-d-k"),
    (
        "scaled_dot_product_attention",
        "scales by the model width",
        sdpa_scales_by_model_width,
        "scale-by-model-width",
    ),
    (
        "scaled_dot_product_attention",
        "scales by the length",
        sdpa_scales_by_length,
        "scale-by-length",
    ),
    (
        "scaled_dot_product_attention",
        "squeezes the batch axis",
        sdpa_squeezes_batch,
        "batch size B = 1: weights: expected shape (1, 3, 5)",
    ),
    (
        "scaled_dot_product_attention",
        "softmax over queries",
        sdpa_softmax_over_queries,
        "softmax-over-queries",
    ),
    ("scaled_dot_product_attention", "inverted mask", sdpa_inverted_mask, "mask-inverted"),
    (
        "scaled_dot_product_attention",
        "mask after softmax",
        sdpa_mask_after_softmax,
        "mask-after-softmax",
    ),
    ("scaled_dot_product_attention", "NaN rows", sdpa_nan_rows, "fully-masked-row-nan"),
    (
        "scaled_dot_product_attention",
        "ignores scale",
        sdpa_ignores_scale,
        "scale-argument-ignored",
    ),
    ("scaled_dot_product_attention", "scales by d_v", sdpa_scales_by_dv, "scale-by-d-v"),
    (
        "scaled_dot_product_attention",
        "-1e9 fill",
        sdpa_large_negative_fill,
        "fully-masked-row-uniform",
    ),
    (
        "scaled_dot_product_attention",
        "ignores dropout",
        sdpa_ignores_dropout,
        "`dropout_p` is ignored",
    ),
    (
        "scaled_dot_product_attention",
        "returns weights before dropout",
        sdpa_returns_weights_before_dropout,
        "weights from before dropout",
    ),
    (
        "scaled_dot_product_attention",
        "dropout not rescaled",
        sdpa_dropout_not_rescaled,
        "dropout-unscaled",
    ),
    (
        "scaled_dot_product_attention",
        "dropout p as keep probability",
        sdpa_dropout_keep_probability,
        "dropout-keep-probability",
    ),
    ("additive_attention", "no tanh", AdditiveNoTanh, "additive-tanh-missing"),
    ("additive_attention", "wrong parameter names", AdditiveWrongNames, "could not load"),
    ("additive_attention", "inverted mask", AdditiveInvertedMask, "mask-inverted"),
    (
        "additive_attention",
        "softmax over queries",
        AdditiveSoftmaxOverQueries,
        "softmax-over-queries",
    ),
    (
        "additive_attention",
        "keeps the query axis",
        AdditiveKeepsQueryAxis,
        "single-query-axis-kept",
    ),
    (
        "additive_attention",
        "detached weights",
        AdditiveDetachedWeights,
        "the returned weights do not require grad",
    ),
    (
        "additive_attention",
        "(B, S) mask not unsqueezed",
        AdditiveMaskNotUnsqueezed,
        "single-query-mask-broadcast",
    ),
    ("additive_attention", "squeeze() with no dim", AdditiveSqueezeAll, "`.squeeze()` with no dim"),
    (
        "scaled_dot_product_attention",
        "float mask converted to bool",
        sdpa_float_mask_as_bool,
        "float-mask-as-bool",
    ),
    (
        "scaled_dot_product_attention",
        "scale or default",
        sdpa_scale_falsy,
        "scale-zero-ignored",
    ),
    (
        "scaled_dot_product_attention",
        "bool mask multiplied",
        sdpa_multiplies_bool_mask,
        "bool-mask-multiplies",
    ),
]


# ---------------------------------------------------------------- issue 24, round 3 (verdicts)
# Kept apart from CATALOGUE above; tests/test_verdicts_round3.py runs ROUND3.


def sdpa_dropout_on_output(query, key, value, mask=None, dropout_p=0.0, scale=None):
    """Applies dropout to the output (weights @ value) instead of the weights."""
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    weights = _safe_softmax(_masked(query @ key.transpose(-2, -1) * scale, mask))
    return torch.nn.functional.dropout(weights @ value, p=dropout_p), weights


def soft_argmax_unshifted_sum(scores, beta=1.0, dim=-1):
    """Subtracts the max in the numerator but not in the sum: rows do not sum to 1."""
    scaled = beta * scores
    shifted = scaled - scaled.amax(dim=dim, keepdim=True)
    return torch.exp(shifted) / torch.exp(scaled).sum(dim=dim, keepdim=True)


ROUND3 = [
    (
        "scaled_dot_product_attention",
        "dropout on the output",
        sdpa_dropout_on_output,
        "dropout is applied to the output",
    ),
    ("soft_argmax", "max subtracted in the numerator only", soft_argmax_unshifted_sum, None),
]
