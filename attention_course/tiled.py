"""Tiled attention with an online softmax (the FlashAttention recurrence).

Attention never needs the whole ``T x S`` score matrix at once. Process the
keys in blocks and keep, for every query, a running maximum ``m``, a running
normaliser ``l`` and a running weighted sum ``acc``. When a new block raises the
maximum from ``m`` to ``m'``, everything accumulated so far is rescaled by
``exp(m - m')``:

.. math::
    m' = \\max(m, \\max_j s_j), \\quad
    l' = e^{m - m'} l + \\sum_j e^{s_j - m'}, \\quad
    acc' = e^{m - m'} acc + \\sum_j e^{s_j - m'} v_j

and at the end ``output = acc / l``. Only a ``block x block`` tile of scores
exists at any time.
"""

from __future__ import annotations

import math

import torch

from ._validate import check_mask, check_positive_int
from .attention import _scores_shape, _validate_qkv


def tiled_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    block_size: int = 128,
) -> torch.Tensor:
    """Scaled dot-product attention computed block by block (online softmax).

    Same result as :func:`scaled_dot_product_attention` (and
    ``F.scaled_dot_product_attention``) up to rounding, including zero output
    for fully masked query rows, without materialising the ``T x S`` scores.

    Shapes:
        query: ``(..., T, Dk)``; key: ``(..., S, Dk)``; value: ``(..., S, Dv)``;
        mask: broadcastable to ``(..., T, S)``; returns ``(..., T, Dv)``.
    """
    T, S = _validate_qkv(query, key, value)
    target = _scores_shape(query, key, value)
    if mask is not None:
        check_mask(mask, target, "(..., T, S)")
        mask = mask.expand(target)  # a view: no memory is allocated
    check_positive_int("block_size", block_size)
    scale = 1.0 / math.sqrt(query.shape[-1])
    batch = target[:-2]
    out_dtype = query.dtype
    compute = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    outputs = []
    for q0 in range(0, T, block_size):
        q = query[..., q0 : q0 + block_size, :].to(compute) * scale  # (..., Tb, Dk)
        Tb = q.shape[-2]
        m = torch.full((*batch, Tb, 1), -math.inf, dtype=compute, device=query.device)
        l = torch.zeros((*batch, Tb, 1), dtype=compute, device=query.device)  # noqa: E741
        acc = torch.zeros((*batch, Tb, value.shape[-1]), dtype=compute, device=query.device)
        for k0 in range(0, S, block_size):
            k = key[..., k0 : k0 + block_size, :].to(compute)  # (..., Sb, Dk)
            v = value[..., k0 : k0 + block_size, :].to(compute)  # (..., Sb, Dv)
            s = q @ k.transpose(-2, -1)  # (..., Tb, Dk) @ (..., Dk, Sb) -> (..., Tb, Sb)
            if mask is not None:
                tile = mask[..., q0 : q0 + block_size, k0 : k0 + block_size]
                if tile.dtype == torch.bool:
                    s = s.masked_fill(~tile, -math.inf)
                else:
                    s = s + tile.to(compute)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # running max (..., Tb, 1)
            # While every score seen so far is -inf, shift by 0 instead (avoids -inf - -inf).
            shift = m_new.masked_fill(torch.isneginf(m_new), 0.0)
            p = torch.exp(s - shift)  # (..., Tb, Sb); exp(-inf) = 0 for masked keys
            correction = torch.exp(m - shift)  # rescales the old sums: e^{m - m'}
            l = correction * l + p.sum(dim=-1, keepdim=True)  # noqa: E741
            acc = correction * acc + p @ v  # (..., Tb, Sb) @ (..., Sb, Dv) -> (..., Tb, Dv)
            m = m_new
        # Rows that saw no allowed key have l = 0 and acc = 0: output zero, not 0/0.
        outputs.append((acc / l.clamp_min(torch.finfo(compute).tiny)).to(out_dtype))
    return torch.cat(outputs, dim=-2)  # (..., T, Dv)
