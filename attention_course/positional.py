"""Positional information: sinusoidal encodings and learned embeddings.

Self-attention without positions is permutation-equivariant: it cannot tell
"dog bites man" from "man bites dog". These modules add a position-dependent
vector to each token embedding.
"""

from __future__ import annotations

import torch
from torch import nn

from ._validate import check_positive_int, check_probability, require_float, shape_str


def sinusoidal_positional_encoding(
    max_len: int,
    d_model: int,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The fixed sinusoidal encoding of Vaswani et al. (2017).

    .. math::
        PE_{p, 2i} = \\sin\\left(p / 10000^{2i/d}\\right), \\quad
        PE_{p, 2i+1} = \\cos\\left(p / 10000^{2i/d}\\right)

    Even columns hold sines, odd columns cosines of the *same* angle; column
    pair ``i`` has wavelength ``2 pi 10000^{2i/d}``. Computed in float64, returned
    in ``dtype`` (default: torch's default dtype). Values lie in ``[-1, 1]``.
    PyTorch has no built-in; the tests compare it with the formula.

    Shapes:
        returns ``(max_len, d_model)``.
    """
    check_positive_int("max_len", max_len)
    check_positive_int("d_model", d_model)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    # Computed in float64 on the CPU (Apple MPS has no float64), then moved.
    position = torch.arange(max_len, dtype=torch.float64)[:, None]  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(D/2),)
    angle = position / 10000 ** (two_i / d_model)  # (L, 1) / (ceil(D/2),) -> (L, ceil(D/2))
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])  # odd d_model: one fewer cosine column
    return pe.to(device=device, dtype=dtype)


def _check_positions(x: torch.Tensor, d_model: int, max_len: int, start: int) -> None:
    require_float("x", x)
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(f"x: got shape {shape_str(x.shape)}, expected (B, T, {d_model})")
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise ValueError(f"start: got {start!r}, expected a non-negative int")
    if start + x.shape[1] > max_len:
        raise ValueError(
            f"x: got a sequence of length {x.shape[1]} starting at position {start}, expected "
            f"at most max_len={max_len} positions (build the module with a larger max_len)"
        )


class PositionalEncoding(nn.Module):
    """Adds the sinusoidal encoding to a batch of embeddings, then dropout.

    PyTorch has no built-in (``nn.Transformer`` leaves positions to the user).
    The table is a non-persistent buffer: it moves with ``.to(device)`` but is
    not stored in the ``state_dict`` (it is a formula, not a parameter).
    ``start`` offsets the positions (used when decoding one token at a time).

    Shapes:
        x: ``(B, T, D)``; returns ``(B, T, D)``.
    """

    def __init__(self, d_model: int, max_len: int = 5000, dropout: float = 0.0) -> None:
        super().__init__()
        check_probability("dropout", dropout)
        self.d_model = d_model
        self.max_len = max_len
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model), False)

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        _check_positions(x, self.d_model, self.max_len, start)
        pe = self.pe[start : start + x.shape[1]].to(x.dtype)  # (T, D), broadcasts over B
        return self.dropout(x + pe)


class LearnedPositionalEmbedding(nn.Module):
    """Adds a learned vector per position (as in BERT and GPT-2), then dropout.

    The table is an ``nn.Embedding(max_len, d_model)`` looked up at positions
    ``start .. start + T - 1``. Unlike the sinusoidal table it has
    ``max_len * d_model`` parameters and cannot represent positions beyond ``max_len``.

    Shapes:
        x: ``(B, T, D)``; returns ``(B, T, D)``.
    """

    def __init__(self, d_model: int, max_len: int = 5000, dropout: float = 0.0) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("max_len", max_len)
        check_probability("dropout", dropout)
        self.d_model = d_model
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        _check_positions(x, self.d_model, self.max_len, start)
        positions = torch.arange(start, start + x.shape[1], device=x.device)  # (T,)
        return self.dropout(x + self.embedding(positions).to(x.dtype))  # (B, T, D) + (T, D)
