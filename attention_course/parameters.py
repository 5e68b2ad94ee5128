"""Counting parameters, the way the course states its "4 d^2", "8 d^2" facts."""

from __future__ import annotations

from torch import nn


def count_parameters(module: nn.Module, weights_only: bool = False) -> int:
    """Number of parameters of ``module``.

    ``weights_only=True`` counts only weight matrices (parameters with two or
    more dimensions), leaving out biases and LayerNorm's gain and shift: the
    count behind "multi-head attention has 4 d_model^2 weights". Equals
    ``sum(p.numel() for p in module.parameters())`` without the flag.

    Shapes:
        none: returns an int.
    """
    if not isinstance(module, nn.Module):
        raise ValueError(f"module: got {type(module).__name__}, expected a torch.nn.Module")
    return sum(p.numel() for p in module.parameters() if not weights_only or p.dim() >= 2)
