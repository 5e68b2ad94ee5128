"""The position-wise feed-forward network of the Transformer."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._validate import check_positive_int, check_probability, require_float, shape_str

_ACTIVATIONS = ("relu", "gelu")


class PositionwiseFeedForward(nn.Module):
    """Two linear maps with a nonlinearity, applied to every position alike.

    .. math:: \\mathrm{FFN}(x) = \\max(0, x W_1 + b_1) W_2 + b_2

    The same weights act on each token separately (a 1-D convolution with
    kernel size 1). It matches the ``linear1 -> activation -> dropout ->
    linear2`` part of ``nn.TransformerEncoderLayer``. With ``d_ff = 4 d_model``
    it has ``8 d_model^2`` weights (plus ``d_ff + d_model`` biases).

    Shapes:
        x: ``(B, T, D)`` (any leading axes); hidden ``(B, T, F)``; returns ``(B, T, D)``.
    """

    def __init__(
        self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu"
    ) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("d_ff", d_ff)
        check_probability("dropout", dropout)
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation: got {activation!r}, expected one of {_ACTIVATIONS}")
        self.activation = activation  # a name, not a stored lambda (see STYLE.md)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        require_float("x", x)
        if x.dim() < 1 or x.shape[-1] != self.linear1.in_features:
            raise ValueError(
                f"x: got shape {shape_str(x.shape)}, expected (..., "
                f"d_model={self.linear1.in_features})"
            )
        hidden = self.linear1(x)  # (B, T, D) -> (B, T, F)
        hidden = F.relu(hidden) if self.activation == "relu" else F.gelu(hidden)
        return self.linear2(self.dropout(hidden))  # (B, T, F) -> (B, T, D)
