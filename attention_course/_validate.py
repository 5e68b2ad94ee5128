"""Input validation shared by the public entry points (private).

Every check raises ``ValueError`` whose message names the argument, what it got
and what was expected, so that a student reads the cause, not a stack trace
from deep inside a matmul.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def shape_str(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ")"


def require_tensor(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: got {type(x).__name__}, expected a torch.Tensor")
    return x


def require_float(name: str, x: object) -> torch.Tensor:
    x = require_tensor(name, x)
    if not x.is_floating_point():
        raise ValueError(f"{name}: got dtype {x.dtype}, expected a floating-point tensor")
    return x


def require_ndim(name: str, x: torch.Tensor, ndims: Sequence[int], layout: str) -> None:
    if x.dim() not in ndims:
        raise ValueError(f"{name}: got shape {shape_str(x.shape)} ({x.dim()}-D), expected {layout}")


def require_size(name: str, x: torch.Tensor, dim: int, size: int, what: str) -> None:
    if x.shape[dim] != size:
        raise ValueError(
            f"{name}: got shape {shape_str(x.shape)}, expected size {size} in dimension "
            f"{dim} ({what})"
        )


def broadcast_batch(names: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
    """Check that the leading (batch) dimensions of several tensors broadcast."""
    try:
        torch.broadcast_shapes(*(t.shape[:-2] for t in tensors))
    except RuntimeError:
        got = ", ".join(f"{n} {shape_str(t.shape)}" for n, t in zip(names, tensors))
        raise ValueError(
            f"{', '.join(names)}: leading (batch) dimensions do not broadcast: got {got}"
        ) from None


def check_mask(mask: object, target: Sequence[int], layout: str, name: str = "mask") -> None:
    """A mask must be bool (True = may attend) or float (additive), broadcastable to target."""
    mask = require_tensor(name, mask)
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise ValueError(
            f"{name}: got dtype {mask.dtype}, expected torch.bool (True = may attend) or a "
            f"floating-point additive mask (0 / -inf); convert 0/1 integers with mask.bool()"
        )
    try:
        out = torch.broadcast_shapes(mask.shape, tuple(target))
    except RuntimeError:
        out = None
    if out is None or tuple(out) != tuple(target):
        raise ValueError(
            f"{name}: got shape {shape_str(mask.shape)}, expected a shape that broadcasts to "
            f"{shape_str(target)} {layout}"
        )


def check_probability(name: str, p: object) -> None:
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p < 1.0:
        raise ValueError(f"{name}: got {p!r}, expected a probability in [0, 1)")


def check_positive_int(name: str, n: object) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise ValueError(f"{name}: got {n!r}, expected a positive int")
