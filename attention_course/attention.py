"""Attention as a weighted average: soft/hard argmax, set attention,
scaled dot-product attention and additive (Bahdanau) attention.

Notation (see the package docstring): ``B`` batch, ``T`` queries, ``S`` keys and
values, ``Dk`` query/key width, ``Dv`` value width. The source notes (the lecture
notes this course was first written from; see the book's introduction) write
vectors as columns (``H = X A``); the code is batch-first rows, so the same
equation reads ``H = A @ X`` with ``A`` of shape ``(T, S)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ._validate import (
    LOW_PRECISION,
    check_mask,
    check_probability,
    check_qkv,
    require_float,
    require_ndim,
    shape_str,
)


def _softmax(scores: torch.Tensor, dim: int) -> torch.Tensor:
    """Softmax that accumulates in float32 for half precision, then casts back."""
    if scores.dtype in LOW_PRECISION:
        return torch.softmax(scores.float(), dim=dim).to(scores.dtype)
    return torch.softmax(scores, dim=dim)


def _check_beta(beta: object) -> None:
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta):
        raise ValueError(f"beta: got {beta!r}, expected a finite number (inverse temperature)")


def _check_dim(name: str, x: torch.Tensor, dim: int) -> None:
    if not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(
            f"dim: got {dim!r}, expected an int in [{-x.dim()}, {x.dim() - 1}] for {name} of "
            f"shape {shape_str(x.shape)}"
        )


def soft_argmax(scores: torch.Tensor, beta: float = 1.0, dim: int = -1) -> torch.Tensor:
    """Soft attention weights: ``softmax(beta * scores)`` along ``dim``.

    .. math:: \\alpha_i = \\frac{\\exp(\\beta s_i)}{\\sum_j \\exp(\\beta s_j)}

    ``beta`` is the inverse temperature: ``beta -> 0`` gives uniform weights,
    ``beta -> inf`` approaches :func:`hard_argmax`. The weights are positive and
    sum to 1 along ``dim`` (``||alpha||_1 = 1``). Matches
    ``torch.softmax(beta * scores, dim)``; stable for very large scores because
    the softmax subtracts the maximum before exponentiating.

    Shapes:
        scores: any shape ``(...)``; returns the same shape.
    """
    require_float("scores", scores)
    _check_beta(beta)
    _check_dim("scores", scores, dim)
    return _softmax(beta * scores, dim=dim)


class _ZeroGradOneHot(torch.autograd.Function):
    """argmax as a one-hot vector whose gradient is exactly zero.

    The one-hot output is piecewise constant in the scores, so its derivative
    is zero wherever it exists; we return that zero explicitly so that the
    book can compare gradients of hard and soft attention side by side.
    """

    @staticmethod
    def forward(ctx, scores: torch.Tensor, dim: int) -> torch.Tensor:
        index = scores.argmax(dim=dim, keepdim=True)
        return torch.zeros_like(scores).scatter_(dim, index, 1.0)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return torch.zeros_like(grad_output), None


def hard_argmax(scores: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Hard attention weights: a one-hot vector at the argmax along ``dim``.

    ``||alpha||_0 = 1``: exactly one weight is 1, the rest are 0 (ties go to the
    first maximum, like ``torch.argmax``). Equals
    ``F.one_hot(scores.argmax(dim), n)`` moved to ``dim``, in the dtype of
    ``scores``. Its gradient with respect to ``scores`` is *defined* as zero
    (the true gradient is zero wherever it exists: the one-hot vector is
    piecewise constant in ``scores`` and jumps where the argmax changes). Hard
    attention is therefore not trained by plain backpropagation, only with
    estimators such as REINFORCE or straight-through.

    Shapes:
        scores: any shape ``(...)``; returns the same shape and dtype.
    """
    require_float("scores", scores)
    _check_dim("scores", scores, dim)
    return _ZeroGradOneHot.apply(scores, dim)


def set_attention(
    X: torch.Tensor, beta: float = 1.0, hard: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Self-attention over a set, with no learned parameters.

    Every element ``x_t`` is a query against all elements:
    ``alpha_t = soft(arg)max_beta(X x_t)`` and ``h_t = sum_s alpha_ts x_s``.
    Stacking the queries gives ``A = soft(arg)max_beta(X X^T)`` (rows sum to 1)
    and ``H = A @ X`` (the source notes' column form is ``H = X A``). With no positions
    involved, permuting the rows of ``X`` permutes the rows of ``H`` the same
    way: attention maps sets to sets. PyTorch has no built-in for it; it equals
    ``F.scaled_dot_product_attention(X, X, X, scale=beta)`` returning ``H`` (tested).

    Shapes:
        X: ``(..., T, n)``; returns ``H (..., T, n)`` and ``A (..., T, T)``.
    """
    require_float("X", X)
    require_ndim("X", X, 2, "(..., T, n) with at least 2 dimensions")
    _check_beta(beta)
    scores = X @ X.transpose(-2, -1)  # (..., T, n) @ (..., n, T) -> (..., T, T)
    A = hard_argmax(scores) if hard else soft_argmax(scores, beta=beta)
    H = A @ X  # (..., T, T) @ (..., T, n) -> (..., T, n)
    return H, A


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last axis (keys) that respects a mask and never returns NaN.

    A boolean mask keeps scores where it is True; a float mask is added to the
    scores. Masked scores are replaced by the most negative finite value of the
    dtype (not ``-inf``, whose ``-inf - (-inf)`` is NaN), and the weights of
    masked keys are set to exactly 0 afterwards, so a query row with every key
    masked gets all-zero weights. On rows with at least one allowed key it
    matches ``torch.softmax`` of the masked scores (the weights inside
    ``F.scaled_dot_product_attention``).

    Shapes:
        scores: ``(..., T, S)``; mask broadcastable to it; returns ``(..., T, S)``.
    """
    if mask is None:
        return _softmax(scores, dim=-1)
    if mask.dtype == torch.bool:
        keep = mask
    else:
        # additive mask: 0 keeps, -inf removes. Cast it to the scores' dtype so that a
        # float32 mask also works with half or double scores (the fused path casts it too).
        scores = scores + mask.to(scores.dtype)
        keep = ~torch.isneginf(scores)
    scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    weights = _softmax(scores, dim=-1)
    return weights.masked_fill(~keep, 0.0)  # fully masked rows: zeros, not uniform


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, returning the output *and* the weights.

    .. math:: \\mathrm{Attention}(Q, K, V) = \\mathrm{softmax}\\left(
              \\frac{Q K^\\top}{\\sqrt{d_k}} + M\\right) V

    Matches ``torch.nn.functional.scaled_dot_product_attention`` (same mask
    convention: boolean True = may attend, float = added to the scores), except
    that a query whose keys are all masked gets zero weights and a zero output
    instead of NaN. Dropout, when ``dropout_p > 0``, is applied to the weights
    (as in PyTorch, regardless of train/eval mode: pass 0.0 in eval); the
    returned weights are the ones actually used, so ``output == weights @ value``.

    Shapes:
        query: ``(..., T, Dk)``; key: ``(..., S, Dk)``; value: ``(..., S, Dv)``;
        mask: broadcastable to ``(..., T, S)``.
        returns: output ``(..., T, Dv)`` and weights ``(..., T, S)``.
        The output's length comes from the queries, its width from the values.
    """
    _check_sdpa_inputs(query, key, value, mask, dropout_p, scale)
    if scale is None:
        # Scale by 1/sqrt(d_k): for unit-variance q and k, q.k has variance d_k (chapter 4).
        scale = 1.0 / math.sqrt(query.shape[-1])

    # Scale the query *before* the product (PyTorch's reference path also scales before it):
    # in float16 an unscaled q . k can exceed 65504 and become inf (d_k = 64 entries of 32
    # give 65536), and inf - inf is NaN in the softmax; (q / sqrt(d_k)) . k stays 8192.
    # See chapter 4, "Large scores in half precision".
    scores = (query * scale) @ key.transpose(-2, -1)  # (..., T, Dk) @ (..., Dk, S) -> (..., T, S)
    weights = masked_softmax(scores, mask)  # each row sums to 1 over the S keys
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    output = weights @ value  # (..., T, S) @ (..., S, Dv) -> (..., T, Dv)
    return output, weights


def _check_sdpa_inputs(query, key, value, mask, dropout_p, scale) -> None:
    check_qkv(query, key, value, mask)
    check_probability("dropout_p", dropout_p)
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise ValueError(f"scale: got {scale!r}, expected a float or None")


class AdditiveAttention(nn.Module):
    """Additive (Bahdanau, "concat") attention with a learned alignment model.

    .. math::
        e_{ij} = v^\\top \\tanh(W s_{i-1} + U h_j), \\quad
        \\alpha_{ij} = \\mathrm{softmax}_j(e_{ij}), \\quad
        c_i = \\sum_j \\alpha_{ij} h_j

    ``W`` projects the query (the decoder state ``s_{i-1}``), ``U`` the keys (the
    encoder states ``h_j``), ``v`` reduces the hidden layer to one score per
    key. Vectorised over all queries and keys by broadcasting; no loop.
    PyTorch has no built-in for it: the tests compare it with the formula
    evaluated key by key.

    Shapes:
        query: ``(B, Dq)`` or ``(B, T, Dq)``; keys: ``(B, S, Dk)``;
        values: ``(B, S, Dv)``; mask: bool, broadcastable to ``(B, S)`` resp.
        ``(B, T, S)``, True = may attend.
        returns: context ``(B, Dv)`` / ``(B, T, Dv)`` and weights ``(B, S)`` /
        ``(B, T, S)``.
    """

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.W = nn.Linear(query_dim, hidden_dim, bias=False)  # query -> hidden
        self.U = nn.Linear(key_dim, hidden_dim, bias=False)  # key -> hidden
        self.v = nn.Linear(hidden_dim, 1, bias=False)  # hidden -> one score

    def _validate(self, query, keys, values, mask) -> None:
        for name, x, layouts in (
            ("query", query, ((2, 3), "(B, Dq) or (B, T, Dq)")),
            ("keys", keys, ((3,), "(B, S, Dk)")),
            ("values", values, ((3,), "(B, S, Dv)")),
        ):
            require_float(name, x)
            require_ndim(name, x, *layouts)
        if query.shape[-1] != self.W.in_features:
            raise ValueError(
                f"query: got shape {shape_str(query.shape)}, expected last dimension "
                f"query_dim={self.W.in_features}"
            )
        if keys.shape[-1] != self.U.in_features:
            raise ValueError(
                f"keys: got shape {shape_str(keys.shape)}, expected (B, S, "
                f"key_dim={self.U.in_features})"
            )
        if values.shape[:2] != keys.shape[:2]:
            raise ValueError(
                f"values: got shape {shape_str(values.shape)}, expected (B, S, Dv) with "
                f"(B, S) = {shape_str(keys.shape[:2])} from keys"
            )
        if query.shape[0] != keys.shape[0]:
            raise ValueError(
                f"query: got batch size {query.shape[0]}, expected {keys.shape[0]} to match keys"
            )
        if mask is not None:
            B, S = keys.shape[:2]
            single = query.dim() == 2
            target = (B, S) if single else (B, query.shape[1], S)
            check_mask(mask, target, "(B, S)" if single else "(B, T, S)")

    def forward(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._validate(query, keys, values, mask)
        single = query.dim() == 2
        if single:
            query = query[:, None, :]  # (B, Dq) -> (B, 1, Dq)
            if mask is not None:
                mask = mask[..., None, :]  # (B, S) -> (B, 1, S)

        q = self.W(query)  # (B, T, Dq) -> (B, T, hidden)
        k = self.U(keys)  # (B, S, Dk) -> (B, S, hidden)
        # Every query meets every key by broadcasting: (B, T, 1, hidden) + (B, 1, S, hidden).
        features = torch.tanh(q[:, :, None, :] + k[:, None, :, :])  # (B, T, S, hidden)
        scores = self.v(features).squeeze(-1)  # (B, T, S, 1) -> (B, T, S)
        weights = masked_softmax(scores, mask)  # softmax over the keys j
        context = weights @ values  # (B, T, S) @ (B, S, Dv) -> (B, T, Dv)
        if single:
            return context[:, 0], weights[:, 0]  # (B, 1, .) -> (B, .)
        return context, weights
