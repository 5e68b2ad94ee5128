"""Multi-head attention: several narrow attentions side by side.

``d_model`` is split into ``H`` heads of width ``Dh = d_model / H``; each head
attends on its own, the heads are concatenated and mixed by ``w_o``.
"""

from __future__ import annotations

import torch
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
from .fused import AttentionMask, FusedMask, fused_attention
from .kv_cache import AttentionCache, MemoryCache


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
    return _split_heads(x, num_heads)


def _split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """:func:`split_heads` without its checks, for the modules, whose constructor and
    ``forward`` have checked the shapes once (validation at the entry points only)."""
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
    return _merge_heads(x)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    """:func:`merge_heads` without its check (see :func:`_split_heads`)."""
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
            length = "T" if name == "query" else "S"
            require_float(name, x)
            require_ndim(name, x, (3,), f"(B, {length}, {width})")
            if x.shape[-1] != width:
                raise ValueError(
                    f"{name}: got shape {shape_str(x.shape)}, expected (B, {length}, {width})"
                )
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(
                f"query, key, value: got batch sizes {query.shape[0]}, {key.shape[0]}, "
                f"{value.shape[0]}, expected one batch size B"
            )
        if key.shape[1] != value.shape[1]:
            raise ValueError(
                f"value: got shape {shape_str(value.shape)}, expected S={key.shape[1]} "
                f"positions to match key {shape_str(key.shape)}"
            )
        if isinstance(mask, AttentionMask):
            mask = mask.dense
        if mask is not None and not isinstance(mask, FusedMask):
            target = (query.shape[0], self.num_heads, query.shape[1], key.shape[1])
            check_mask(mask, target, "(B, H, T, S)")

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | AttentionMask | None = None,
        need_weights: bool = True,
        cache: AttentionCache | MemoryCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """With ``cache`` (an :class:`~attention_course.kv_cache.AttentionCache`, or a
        :class:`~attention_course.kv_cache.MemoryCache` for cross-attention, from a
        decoder that has checked its inputs), ``key`` and ``value`` hold only the new
        positions: their projections are appended to the cached ones (the memory's are
        projected once), and ``mask`` covers all cached keys. ``mask`` may be an
        :class:`~attention_course.fused.AttentionMask`, the mask a model builds once
        for all its layers."""
        if cache is None:
            self._validate(query, key, value, mask)
        q = _split_heads(self.w_q(query), self.num_heads)  # (B, T, D) -> (B, H, T, Dh)
        if cache is not None and cache.filled:  # cross-attention: the memory is projected once
            k, v = cache.keys, cache.values
        else:
            k = _split_heads(self.w_k(key), self.num_heads)  # (B, S, kdim) -> (B, H, S, Dh)
            v = _split_heads(self.w_v(value), self.num_heads)  # (B, S, vdim) -> (B, H, S, Dh)
            if cache is not None:
                k, v = self._remember(k, v, cache)
        return self.attend(q, k, v, mask, need_weights)

    @staticmethod
    def _remember(k, v, cache):
        """The one place in the package's attention modules (and so in the GPT and the
        Transformer) that writes a KV cache: the new positions' keys and
        values go into ``cache`` (None: no cache), and all the keys and values the queries
        may see come back. Every attention module (this one, and
        :class:`~attention_course.gpt.CausalSelfAttention` after its rotation) calls it
        between its projections and :meth:`attend`, which never sees a cache.

        Shapes: k, v ``(B, Hkv, Tn, Dh)``; returns two ``(B, Hkv, S, Dh)``.
        """
        if cache is None:
            return k, v
        return cache.update(k, v)

    def attend(self, q, k, v, mask=None, need_weights: bool = True):
        """Attention of projected heads, then the output projection ``w_o``.

        The one place in the package's attention modules that computes multi-head
        attention (the checkers keep independent versions to judge against): :meth:`forward`
        calls it after the projections; a variant that transforms the heads first (rotary
        positions, grouped keys and values) calls it with its own ``q, k, v``. It
        never touches a KV cache: ``k`` and ``v`` are every key and value the queries
        may see. ``need_weights=False`` takes PyTorch's fused kernel and returns None
        for the weights.

        Shapes: q ``(B, H, T, Dh)``; k, v ``(B, H, S, Dh)``; mask broadcastable to
        ``(B, H, T, S)``, or an :class:`~attention_course.fused.AttentionMask`;
        returns ``(B, T, D)`` and weights ``(B, H, T, S)`` or None.
        """
        if isinstance(mask, AttentionMask):  # the model's one mask, converted at most once
            mask = mask.dense if need_weights else mask.fused(q.dtype)
        p = self.dropout if self.training else 0.0
        if need_weights:
            heads, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=p)
        else:
            heads, weights = fused_attention(q, k, v, mask, p), None
        return self.w_o(_merge_heads(heads)), weights  # (B, H, T, Dh) -> (B, T, D)
