"""Masks: which keys each query may look at.

Convention (the same as ``torch.nn.functional.scaled_dot_product_attention``):
a boolean mask is **True where a query may attend** and broadcasts to
``(B, H, T, S)``. ``nn.MultiheadAttention``'s ``attn_mask`` and
``key_padding_mask`` use the opposite convention (True = ignore); convert
only at that boundary with :func:`to_torch_mha_mask`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._validate import check_mask, check_positive_int, shape_str


def causal_mask(
    size: int, device: torch.device | str | None = None, *, S: int | None = None
) -> torch.Tensor:
    """Boolean causal ("look-ahead") mask: position ``t`` may attend to ``s <= t``.

    ``M[t, s] = (s <= t)``: True on and below the diagonal. It matches
    ``~torch.nn.Transformer.generate_square_subsequent_mask(size).isinf()``.

    With ``S`` keys (``S >= size``, default ``size``) the ``size`` queries are the
    *last* ``size`` of ``S`` positions, as when new tokens meet a KV cache: query
    ``i`` sits at position ``i + S - size`` and ``M[i, s] = (s <= i + S - size)``.
    The result equals the last ``size`` rows of ``causal_mask(S)``.

    Shapes:
        returns: ``(size, S)`` bool; broadcasts to ``(B, H, T, S)``.
    """
    check_positive_int("size", size)
    if S is None:
        S = size
    elif not isinstance(S, int) or isinstance(S, bool) or S < size:
        raise ValueError(f"S: got {S!r}, expected None or an int >= size={size}")
    return torch.ones(size, S, dtype=torch.bool, device=device).tril(diagonal=S - size)


def padding_mask(lengths: torch.Tensor | Sequence[int], max_len: int | None = None) -> torch.Tensor:
    """Boolean key-padding mask from sequence lengths: True at real tokens.

    ``M[b, s] = (s < lengths[b])``. To use it as an attention mask, add the
    head and query axes: ``padding_mask(lengths)[:, None, None, :]`` has shape
    ``(B, 1, 1, S)`` and broadcasts to ``(B, H, T, S)``. PyTorch's
    ``key_padding_mask`` for ``nn.MultiheadAttention`` is its negation.

    Shapes:
        lengths: ``(B,)`` integers in ``[0, max_len]``.
        returns: ``(B, max_len)`` bool; ``max_len`` defaults to ``max(lengths)``.
    """
    if not isinstance(lengths, torch.Tensor):
        try:
            lengths = torch.as_tensor(lengths)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(
                f"lengths: got {type(lengths).__name__}, expected a 1-D tensor or list of ints"
            ) from err
    if lengths.dim() != 1:
        raise ValueError(
            f"lengths: got shape {shape_str(lengths.shape)}, expected a 1-D tensor (B,)"
        )
    if lengths.dtype == torch.bool or lengths.is_floating_point() or lengths.is_complex():
        raise ValueError(f"lengths: got dtype {lengths.dtype}, expected an integer dtype")
    if max_len is None:
        max_len = int(lengths.max()) if lengths.numel() else 0
    elif not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 0:
        raise ValueError(f"max_len: got {max_len!r}, expected a non-negative int")
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > max_len):
        raise ValueError(
            f"lengths: got values in [{int(lengths.min())}, {int(lengths.max())}], expected "
            f"every length in [0, max_len={max_len}]"
        )
    positions = torch.arange(max_len, device=lengths.device)  # (S,)
    return positions[None, :] < lengths[:, None]  # (1, S) < (B, 1) -> (B, S)


def to_torch_mha_mask(mask: torch.Tensor) -> torch.Tensor:
    """Convert a course mask (True = attend) to ``nn.MultiheadAttention``'s (True = ignore).

    Boolean masks are inverted; float (additive) masks mean the same thing in
    both APIs and are returned unchanged.

    Shapes:
        mask: any shape; returns the same shape.
    """
    check_mask(mask, mask.shape, "", name="mask")
    return ~mask if mask.dtype == torch.bool else mask


def to_additive_mask(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Boolean mask (True = attend) -> additive float mask (0 where allowed, -inf elsewhere).

    This is the ``triu(-inf, diagonal=1)`` form of the causal mask used by
    ``nn.Transformer.generate_square_subsequent_mask``.

    Shapes:
        mask: any shape; returns the same shape, in ``dtype``.
    """
    check_mask(mask, mask.shape, "", name="mask")
    if mask.dtype != torch.bool:
        return mask.to(dtype)
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return additive.masked_fill(~mask, float("-inf"))
