"""Multi-head attention: several narrow attentions side by side.

``d_model`` is split into ``H`` heads of width ``Dh = d_model / H``; each head
attends on its own, the heads are concatenated and mixed by ``w_o``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ._validate import (
    check_mask,
    check_positive_int,
    check_probability,
    require_float,
    require_ndim,
    shape_str,
)
from .attention import scaled_dot_product_attention


def _check_heads(d_model: int, num_heads: int) -> None:
    check_positive_int("d_model", d_model)
    check_positive_int("num_heads", num_heads)
    if d_model % num_heads != 0:
        raise ValueError(
            f"num_heads: got {num_heads}, expected a divisor of d_model={d_model} "
            f"(each head gets d_model / num_heads features)"
        )


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Split the feature axis into heads: view, *then* transpose.

    ``x.view(B, T, H, Dh)`` keeps every token's features together and cuts them
    into ``H`` slices; the transpose then brings the head axis forward. A bare
    ``x.reshape(B, H, T, Dh)`` would instead mix features of different tokens
    into one head. ``nn.MultiheadAttention`` does the same internally (it has
    no public function for it).

    Shapes:
        x: ``(B, T, D)``; returns ``(B, H, T, Dh)`` with ``Dh = D / H``.
    """
    require_ndim("x", x, (3,), "(B, T, D)")
    _check_heads(x.shape[-1], num_heads)
    B, T, D = x.shape
    x = x.view(B, T, num_heads, D // num_heads)  # (B, T, D) -> (B, T, H, Dh)
    return x.transpose(1, 2)  # (B, T, H, Dh) -> (B, H, T, Dh)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`split_heads`: concatenate the heads' features.

    ``merge_heads(split_heads(x, H)) == x``; as in ``nn.MultiheadAttention``,
    the concatenated heads then go through the output projection ``w_o``.

    Shapes:
        x: ``(B, H, T, Dh)``; returns ``(B, T, H * Dh)``.
    """
    require_ndim("x", x, (4,), "(B, H, T, Dh)")
    B, H, T, Dh = x.shape
    x = x.transpose(1, 2)  # (B, H, T, Dh) -> (B, T, H, Dh)
    return x.reshape(B, T, H * Dh)  # (B, T, H, Dh) -> (B, T, D); copies: x is not contiguous


class MultiHeadAttention(nn.Module):
    """Multi-head attention with explicit projections ``w_q, w_k, w_v, w_o``.

    .. math::
        \\mathrm{head}_h = \\mathrm{Attention}(Q W_q^{(h)}, K W_k^{(h)}, V W_v^{(h)}),\\quad
        \\mathrm{MHA}(Q, K, V) = [\\mathrm{head}_1; \\dots; \\mathrm{head}_H] W_o

    Matches ``nn.MultiheadAttention(d_model, num_heads, dropout, bias, kdim=kdim,
    vdim=vdim, batch_first=True)`` with copied weights
    (:func:`attention_course.interop.copy_weights_from_torch`), except for the
    mask convention (here True = may attend) and the returned weights, which
    are per head ``(B, H, T, S)`` (PyTorch averages them by default).

    With ``need_weights=False`` the heads are computed by PyTorch's fused
    ``F.scaled_dot_product_attention``; fully masked query rows still give a
    zero output. Both paths give the same output.

    Shapes:
        query: ``(B, T, D)``; key: ``(B, S, kdim)``; value: ``(B, S, vdim)``;
        mask: bool or float, broadcastable to ``(B, H, T, S)``.
        returns: output ``(B, T, D)`` and weights ``(B, H, T, S)`` or None.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        kdim: int | None = None,
        vdim: int | None = None,
    ) -> None:
        super().__init__()
        _check_heads(d_model, num_heads)
        check_probability("dropout", dropout)
        kdim = d_model if kdim is None else kdim
        vdim = d_model if vdim is None else vdim
        check_positive_int("kdim", kdim)
        check_positive_int("vdim", vdim)
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_head = d_model // num_heads
        self.dropout = dropout
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(kdim, d_model, bias=bias)
        self.w_v = nn.Linear(vdim, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def _validate(self, query, key, value, mask) -> None:
        for name, x, width in (
            ("query", query, self.w_q.in_features),
            ("key", key, self.w_k.in_features),
            ("value", value, self.w_v.in_features),
        ):
            require_float(name, x)
            length = "T" if name == "query" else "S"
            require_ndim(name, x, (3,), f"(B, {length}, {width})")
            if x.shape[-1] != width:
                raise ValueError(
                    f"{name}: got shape {shape_str(x.shape)}, expected (B, {length}, {width})"
                )
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(
                f"query, key, value: got batch sizes {query.shape[0]}, {key.shape[0]}, "
                f"{value.shape[0]}, expected one batch size"
            )
        if key.shape[1] != value.shape[1]:
            raise ValueError(
                f"value: got shape {shape_str(value.shape)}, expected S={key.shape[1]} "
                f"positions to match key {shape_str(key.shape)}"
            )
        if mask is not None:
            target = (query.shape[0], self.num_heads, query.shape[1], key.shape[1])
            check_mask(mask, target, "(B, H, T, S)")

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
        need_weights: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        self._validate(query, key, value, mask)
        p = self.dropout if self.training else 0.0
        q = split_heads(self.w_q(query), self.num_heads)  # (B, T, D) -> (B, H, T, Dh)
        k = split_heads(self.w_k(key), self.num_heads)  # (B, S, kdim) -> (B, S, D) -> (B, H, S, Dh)
        v = split_heads(
            self.w_v(value), self.num_heads
        )  # (B, S, vdim) -> (B, S, D) -> (B, H, S, Dh)
        if need_weights:
            heads, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=p)
        else:
            heads, weights = _fused_attention(q, k, v, mask, p), None
        output = self.w_o(merge_heads(heads))  # (B, H, T, Dh) -> (B, T, D) -> (B, T, D)
        return output, weights


class _SDPAMask(NamedTuple):
    """A course mask converted once for ``F.scaled_dot_product_attention``.

    Converting costs a few small operations; a decoder that applies the same mask
    in every layer (or at every decoding step, for the source padding) converts it
    once and passes this to :func:`_fused_attention`.

    Attributes:
        additive: float, 0 where a query may attend and -inf elsewhere, except on
            fully masked rows, which are all 0 (attend everywhere: finite, and zeroed later).
        empty: bool ``(..., T, 1)``, True on the fully masked rows; None when there are none.
    """

    additive: torch.Tensor
    empty: torch.Tensor | None


def _prepare_sdpa_mask(mask: torch.Tensor, dtype: torch.dtype) -> _SDPAMask:
    """Convert a bool (True = may attend) or additive float mask into an :class:`_SDPAMask`."""
    if mask.dtype == torch.bool:
        # The kernels are faster with an additive float mask than with a bool one.
        additive = torch.full(mask.shape, float("-inf"), dtype=dtype, device=mask.device)
        additive.masked_fill_(mask, 0.0)  # 0 where a query may attend, -inf elsewhere
    else:
        additive = mask.to(dtype)
    empty = torch.isneginf(additive).all(dim=-1, keepdim=True)  # (.., T, 1): no key allowed
    if not bool(empty.any()):  # the usual case: every query may attend somewhere
        return _SDPAMask(additive, None)
    return _SDPAMask(additive.masked_fill(empty, 0.0), empty)


def _fused_attention(q, k, v, mask, dropout_p: float) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with fully masked rows returning zeros.

    PyTorch's kernels may return NaN for a query that may attend to nothing.
    We let such rows attend everywhere (a harmless, finite computation) and
    zero their output afterwards. ``mask`` is None, a course mask, or an
    :class:`_SDPAMask` prepared earlier.
    """
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    if not isinstance(mask, _SDPAMask):
        mask = _prepare_sdpa_mask(mask, q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.additive, dropout_p=dropout_p)
    if mask.empty is None:
        return out
    return out.masked_fill(mask.empty, 0.0)  # (.., T, 1) broadcasts over Dh
