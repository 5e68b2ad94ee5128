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
        # a name, not a stored lambda: a closure stored on a module survives deepcopy and
        # can keep pointing at the old weights (minGPT had that bug)
        self.activation = activation
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


class SwiGLU(nn.Module):
    """The gated feed-forward network of LLaMA (Shazeer, 2020, "GLU Variants Improve Transformer").

    .. math:: \\mathrm{SwiGLU}(x) = W_2\\,(\\mathrm{SiLU}(W_1 x) \\odot W_3 x)

    ``w1`` is the gate (through SiLU, ``x * sigmoid(x)``), ``w3`` the up projection
    (no activation) and ``w2`` the down projection, all ``nn.Linear`` (LLaMA's names;
    Hugging Face ``LlamaMLP`` calls them ``gate_proj``, ``up_proj``, ``down_proj``).
    Without biases it has ``3 * d_model * d_ff`` weights: three matrices instead of two,
    so ``d_ff = 2/3 * 4 * d_model`` keeps the count of a ``4 * d_model`` ReLU FFN.
    PyTorch has no built-in.

    Shapes:
        x: ``(B, T, D)`` (any leading axes); hidden ``(B, T, F)``; returns ``(B, T, D)``.
    """

    def __init__(self, d_model: int, d_ff: int, bias: bool = False) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("d_ff", d_ff)
        if not isinstance(bias, bool):
            raise ValueError(f"bias: got {bias!r}, expected True or False")
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)  # gate
        self.w3 = nn.Linear(d_model, d_ff, bias=bias)  # up
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        require_float("x", x)
        if x.dim() < 1 or x.shape[-1] != self.w1.in_features:
            raise ValueError(
                f"x: got shape {shape_str(x.shape)}, expected (..., d_model={self.w1.in_features})"
            )
        gate = F.silu(self.w1(x))  # (B, T, D) -> (B, T, F); SiLU on the gate only
        up = self.w3(x)  # (B, T, D) -> (B, T, F)
        return self.w2(gate * up)  # (B, T, F) -> (B, T, D)


def swiglu_hidden_size(d_model: int, multiple_of: int = 8) -> int:
    """LLaMA's SwiGLU width: ``2/3 * 4 * d_model`` rounded up to a multiple of ``multiple_of``.

    Three ``D x F`` matrices with ``F = 8 D / 3`` hold as many weights as the two of a
    ``4 D`` ReLU FFN; LLaMA (Touvron et al., 2023) rounds up to a multiple of 256, this
    course to 8 (e.g. ``d_model=128 -> 344``).
    """
    check_positive_int("d_model", d_model)
    check_positive_int("multiple_of", multiple_of)
    hidden = 2 * 4 * d_model // 3  # int(2 * 4 * d / 3), as LLaMA's int(2 * hidden_dim / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)  # round up


def make_ffn(ffn: str, d_model: int, d_ff: int, dropout: float = 0.0) -> nn.Module:
    """The feed-forward network a :class:`~attention_course.GPT` block uses.

    ``"relu"`` / ``"gelu"``: :class:`PositionwiseFeedForward` (with biases, and dropout on
    the hidden layer); ``"swiglu"``: :class:`SwiGLU` without biases (as LLaMA; no dropout
    inside, the block's residual dropout still applies).
    """
    if ffn in _ACTIVATIONS:
        return PositionwiseFeedForward(d_model, d_ff, dropout, activation=ffn)
    if ffn == "swiglu":
        return SwiGLU(d_model, d_ff, bias=False)
    raise ValueError(f"ffn: got {ffn!r}, expected one of {_ACTIVATIONS + ('swiglu',)}")
