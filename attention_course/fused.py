"""PyTorch's fused attention kernel with the course's masks (chapter 12).

:func:`fused_attention` runs PyTorch's ``F.scaled_dot_product_attention`` with the
course's mask convention (True = may attend) and zero output for fully masked
rows. An :class:`AttentionMask` is the one mask type a model builds once per forward
pass and gives to every layer; it converts itself for the fused kernel (a
:class:`FusedMask`) at most once. The course's own block-by-block attention (the
online softmax) is :mod:`attention_course.tiled`; the KV cache is
:mod:`attention_course.kv_cache`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class FusedMask(NamedTuple):
    """A course mask converted once for ``F.scaled_dot_product_attention``.

    Converting costs a few small operations; a decoder that applies the same mask
    in every layer (or at every decoding step, for the source padding) converts it
    once with :func:`prepare_fused_mask` and passes this to :func:`fused_attention`.

    Attributes:
        additive: float, 0 where a query may attend and -inf elsewhere, except on
            fully masked rows, which are all 0 (attend everywhere: finite, and zeroed later).
        empty: bool ``(..., T, 1)``, True on the fully masked rows; None when there are none.
    """

    additive: torch.Tensor
    empty: torch.Tensor | None


def prepare_fused_mask(mask: torch.Tensor, dtype: torch.dtype) -> FusedMask:
    """Convert a bool (True = may attend) or additive float mask into a :class:`FusedMask`."""
    if mask.dtype == torch.bool:
        # The kernels are faster with an additive float mask than with a bool one.
        additive = torch.full(mask.shape, float("-inf"), dtype=dtype, device=mask.device)
        additive.masked_fill_(mask, 0.0)  # 0 where a query may attend, -inf elsewhere
    else:
        additive = mask.to(dtype)
    empty = torch.isneginf(additive).all(dim=-1, keepdim=True)  # (.., T, 1): no key allowed
    if not bool(empty.any()):  # the usual case: every query may attend somewhere
        return FusedMask(additive, None)
    return FusedMask(additive.masked_fill(empty, 0.0), empty)


def fused_attention(q, k, v, mask, dropout_p: float) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with fully masked rows returning zeros.

    PyTorch's kernels may return NaN for a query that may attend to nothing.
    We let such rows attend everywhere (a harmless, finite computation) and
    zero their output afterwards. ``mask`` is None, a course mask, or a
    :class:`FusedMask` prepared earlier.

    Shapes: q ``(..., T, Dk)``; k ``(..., S, Dk)``; v ``(..., S, Dv)``; returns ``(..., T, Dv)``.
    """
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    if not isinstance(mask, FusedMask):
        mask = prepare_fused_mask(mask, q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.additive, dropout_p=dropout_p)
    if mask.empty is None:
        return out
    return out.masked_fill(mask.empty, 0.0)  # (.., T, 1) broadcasts over Dh


class AttentionMask:
    """The mask of one forward pass: built once by the model, given to every layer.

    ``dense`` is None (every query may see every key), a bool tensor (True = may attend)
    or an additive float tensor (ALiBi's bias with ``-inf`` at hidden keys), broadcastable
    to ``(B, H, T, S)``. The weights path uses it as it is; the fused kernel needs it as a
    :class:`FusedMask`, which :meth:`fused` converts at its first use and keeps, so the
    layers of a model convert it once, not once each.
    """

    __slots__ = ("dense", "_fused")

    def __init__(self, dense: torch.Tensor | None = None) -> None:
        self.dense = dense
        self._fused: FusedMask | None = None

    def fused(self, dtype: torch.dtype) -> FusedMask | None:
        """The mask for :func:`fused_attention` in ``dtype`` (None: no mask needed)."""
        if self.dense is None:
            return None
        if self._fused is None or self._fused.additive.dtype != dtype:
            self._fused = prepare_fused_mask(self.dense, dtype)
        return self._fused

    def __repr__(self) -> str:
        shape = None if self.dense is None else tuple(self.dense.shape)
        return f"AttentionMask(dense={shape})"
