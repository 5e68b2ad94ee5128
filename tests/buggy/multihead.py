"""Buggy split_heads, merge_heads and MultiHeadAttention."""

import math

import torch
from torch import nn


def split_heads_no_transpose(x, num_heads):
    """Views (B, T, D) straight as (B, H, T, Dh): features of different tokens mix."""
    B, T, D = x.shape
    return x.view(B, num_heads, T, D // num_heads)


def split_heads_interleaved(x, num_heads):
    """Cuts D as (Dh, H): head h gets every H-th feature instead of a contiguous slice."""
    B, T, D = x.shape
    return x.view(B, T, D // num_heads, num_heads).permute(0, 3, 1, 2)


def split_heads_forgets_transpose(x, num_heads):
    """Stops after the view: returns (B, T, H, Dh)."""
    B, T, D = x.shape
    return x.view(B, T, num_heads, D // num_heads)


def merge_heads_no_transpose(x):
    """Reshapes (B, H, T, Dh) straight to (B, T, D)."""
    B, H, T, Dh = x.shape
    return x.reshape(B, T, H * Dh)


def merge_heads_view_after_transpose(x):
    """Calls .view on the non-contiguous transposed tensor: RuntimeError."""
    B, H, T, Dh = x.shape
    return x.transpose(1, 2).view(B, T, H * Dh)


def merge_heads_interleaved(x):
    """Puts Dh before H: the heads' features end up interleaved."""
    B, H, T, Dh = x.shape
    return x.permute(0, 2, 3, 1).reshape(B, T, H * Dh)


class _MHABase(nn.Module):
    def __init__(self, d_model, num_heads, dropout=0.0, bias=True, kdim=None, vdim=None):
        super().__init__()
        self.num_heads = num_heads
        self.d_head = d_model // num_heads
        self.dropout = dropout
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(kdim or d_model, d_model, bias=bias)
        self.w_v = nn.Linear(vdim or d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def split(self, x):
        B, L, D = x.shape
        return x.view(B, L, self.num_heads, self.d_head).transpose(1, 2)

    def merge(self, x):
        B, H, L, Dh = x.shape
        return x.transpose(1, 2).reshape(B, L, H * Dh)

    def scale(self):
        return 1.0 / math.sqrt(self.d_head)

    def attend(self, q, k, v, mask):
        scores = q @ k.transpose(-2, -1) * self.scale()
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
        return weights @ v, weights

    def forward(self, query, key, value, mask=None, need_weights=True):
        q = self.split(self.w_q(query))
        k = self.split(self.w_k(key))
        v = self.split(self.w_v(value))
        heads, weights = self.attend(q, k, v, mask)
        output = self.w_o(self.merge(heads))
        return output, (weights if need_weights else None)


class MHASplitNoTranspose(_MHABase):
    """Splits the heads with a bare view to (B, H, T, Dh)."""

    def split(self, x):
        B, L, D = x.shape
        return x.view(B, self.num_heads, L, self.d_head)

    def merge(self, x):
        B, H, L, Dh = x.shape
        return x.reshape(B, L, H * Dh)


class MHAScalesByDModel(_MHABase):
    """Scales the scores by 1/sqrt(d_model) instead of 1/sqrt(d_head)."""

    def scale(self):
        return 1.0 / math.sqrt(self.num_heads * self.d_head)


class MHANoOutputProjection(_MHABase):
    """Returns the concatenated heads without mixing them through w_o."""

    def forward(self, query, key, value, mask=None, need_weights=True):
        q, k, v = (
            self.split(self.w_q(query)),
            self.split(self.w_k(key)),
            self.split(self.w_v(value)),
        )
        heads, weights = self.attend(q, k, v, mask)
        return self.merge(heads), (weights if need_weights else None)


class MHAAveragedWeights(_MHABase):
    """Averages the weights over heads, like nn.MultiheadAttention's default."""

    def forward(self, query, key, value, mask=None, need_weights=True):
        output, weights = super().forward(query, key, value, mask, True)
        return output, (weights.mean(dim=1) if need_weights else None)


class MHAInvertedMask(_MHABase):
    """Fills the scores where the mask is True."""

    def attend(self, q, k, v, mask):
        scores = q @ k.transpose(-2, -1) * self.scale()
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        weights = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
        return weights @ v, weights


class MHAOneBigLinear(nn.Module):
    """Packs the three input projections into one `in_proj` (like nn.MultiheadAttention)."""

    def __init__(self, d_model, num_heads, dropout=0.0, bias=True, kdim=None, vdim=None):
        super().__init__()
        self.num_heads = num_heads
        self.d_head = d_model // num_heads
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query, key, value, mask=None, need_weights=True):
        raise RuntimeError("never reached: the weights cannot be loaded")


class MHANeverDropout(_MHABase):
    """Stores `dropout` but never applies it, not even in training mode."""


class MHADropoutOnOutput(_MHABase):
    """Applies dropout to the output instead of the attention weights."""

    def forward(self, query, key, value, mask=None, need_weights=True):
        output, weights = super().forward(query, key, value, mask, need_weights)
        return nn.functional.dropout(output, self.dropout, self.training), weights


class MHAFloatMaskAsBool(_MHABase):
    """Converts a float mask to bool with `mask == 0` instead of adding it to the scores."""

    def attend(self, q, k, v, mask):
        if mask is not None and mask.dtype != torch.bool:
            mask = mask == 0
        return super().attend(q, k, v, mask)


class MHADropoutInEval(_MHABase):
    """Applies dropout to the weights with training=True, so also in eval mode."""

    def attend(self, q, k, v, mask):
        _, weights = super().attend(q, k, v, mask)
        weights = nn.functional.dropout(weights, self.dropout, training=True)
        return weights @ v, weights


class MHAKeyValueFromQuery(_MHABase):
    """Computes the keys and values from the query input (self-attention only)."""

    def forward(self, query, key, value, mask=None, need_weights=True):
        return super().forward(query, query, query, mask, need_weights)


CATALOGUE = [
    (
        "multi_head_attention",
        "float mask converted to bool",
        MHAFloatMaskAsBool,
        "float-mask-as-bool",
    ),
    ("multi_head_attention", "dropout in eval mode", MHADropoutInEval, "dropout-in-eval"),
    (
        "multi_head_attention",
        "keys and values from the query",
        MHAKeyValueFromQuery,
        "kv-from-query",
    ),
    ("split_heads", "no transpose", split_heads_no_transpose, "heads-split-without-transpose"),
    ("split_heads", "interleaved", split_heads_interleaved, "heads-split-interleaved"),
    (
        "split_heads",
        "forgets transpose",
        split_heads_forgets_transpose,
        "heads-split-transpose-missing",
    ),
    ("merge_heads", "no transpose", merge_heads_no_transpose, "heads-merged-without-transpose"),
    ("merge_heads", "view after transpose", merge_heads_view_after_transpose, "not contiguous"),
    ("merge_heads", "interleaved", merge_heads_interleaved, "heads-merged-interleaved"),
    (
        "multi_head_attention",
        "split without transpose",
        MHASplitNoTranspose,
        "heads-split-without-transpose",
    ),
    ("multi_head_attention", "scales by d_model", MHAScalesByDModel, "scale-by-d-model"),
    ("multi_head_attention", "no output projection", MHANoOutputProjection, "no-output-projection"),
    ("multi_head_attention", "averaged weights", MHAAveragedWeights, "weights-averaged-over-heads"),
    ("multi_head_attention", "inverted mask", MHAInvertedMask, "mask-inverted"),
    ("multi_head_attention", "packed in_proj", MHAOneBigLinear, "could not load"),
    ("multi_head_attention", "never dropout", MHANeverDropout, "dropout-never-applied"),
    (
        "multi_head_attention",
        "dropout on the output",
        MHADropoutOnOutput,
        "dropout is applied somewhere else than on the attention weights",
    ),
]
