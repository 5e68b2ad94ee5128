"""Input validation shared by the public entry points (private).

Every check raises ``ValueError`` whose message names the argument, what it got
and what was expected, so that a student reads the cause, not a stack trace
from deep inside a matmul.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Half precision: accumulate softmaxes and statistics in float32, then cast back.
LOW_PRECISION = (torch.float16, torch.bfloat16)


def shape_str(shape: Sequence[int]) -> str:
    """``(2, 3)``, ``(5,)`` or ``()``, as Python prints a tuple."""
    return str(tuple(int(s) for s in shape))


def require_tensor(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: got {type(x).__name__}, expected a torch.Tensor")
    return x


def require_float(name: str, x: object) -> torch.Tensor:
    x = require_tensor(name, x)
    if not x.is_floating_point():
        raise ValueError(f"{name}: got dtype {x.dtype}, expected a floating-point tensor")
    return x


def require_ndim(name: str, x: torch.Tensor, ndims: Sequence[int] | int, layout: str) -> None:
    """``x`` must have one of the ``ndims`` dimensions, or at least ``ndims`` if it is an int."""
    ok = x.dim() >= ndims if isinstance(ndims, int) else x.dim() in ndims
    if not ok:
        raise ValueError(f"{name}: got shape {shape_str(x.shape)} ({x.dim()}-D), expected {layout}")


def broadcast_batch(names: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
    """Check that the leading (batch) dimensions of several tensors broadcast."""
    try:
        torch.broadcast_shapes(*(t.shape[:-2] for t in tensors))
    except RuntimeError:
        got = ", ".join(f"{n} {shape_str(t.shape)}" for n, t in zip(names, tensors))
        raise ValueError(
            f"{', '.join(names)}: leading (batch) dimensions do not broadcast: got {got}"
        ) from None


def check_qkv(query: object, key: object, value: object, mask: object = None) -> tuple:
    """Queries ``(..., T, Dk)``, keys ``(..., S, Dk)``, values ``(..., S, Dv)`` of one float
    dtype whose leading (batch) axes broadcast, and a mask broadcastable to the scores.

    Returns the scores' shape ``(..., T, S)``.
    """
    for name, x, layout in (
        ("query", query, "T, Dk"),
        ("key", key, "S, Dk"),
        ("value", value, "S, Dv"),
    ):
        require_float(name, x)
        require_ndim(name, x, 2, f"(..., {layout}), at least 2-D")
    if not query.dtype == key.dtype == value.dtype:
        raise ValueError(
            f"query, key, value: got dtypes {query.dtype}, {key.dtype}, {value.dtype}, "
            f"expected one dtype for all three"
        )
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(
            f"key: got shape {shape_str(key.shape)}, expected last dimension {query.shape[-1]} "
            f"to match query {shape_str(query.shape)} (queries and keys share the width Dk)"
        )
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(
            f"value: got shape {shape_str(value.shape)}, expected S={key.shape[-2]} positions in "
            f"dimension -2 to match key {shape_str(key.shape)} (one value per key)"
        )
    broadcast_batch(("query", "key", "value"), (query, key, value))
    batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    target = (*batch, query.shape[-2], key.shape[-2])
    if mask is not None:
        check_mask(mask, target, "(..., T, S)")
    return target


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
