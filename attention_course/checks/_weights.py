"""Shared by the attention checkers: softmax-then-average with a mistake's masking, and
the comparison of (weights, output) pairs that blames the weights first."""

from __future__ import annotations

import torch

from ._compare import expect_close, sums_to_one_hint


def attend(scores, value, mask=None, *, dim=-1, after=False, invert=False, fill="zero-rows"):
    """Softmax the scores (masked one way or another) and average the values."""
    if mask is not None and mask.dtype == torch.bool:
        keep = ~mask if invert else mask
        if not after:
            if fill == "large-negative":
                scores = scores.masked_fill(~keep, -1e9)
            else:
                scores = scores.masked_fill(~keep, float("-inf"))
    elif mask is not None:
        scores = scores + mask
    weights = torch.softmax(scores, dim=dim)
    if fill == "zero-rows":
        weights = torch.nan_to_num(weights, nan=0.0)
    if mask is not None and mask.dtype == torch.bool and after:
        weights = weights * keep
    return weights @ value, weights


def expect_weights_then_output(
    got: tuple,
    expected: tuple[torch.Tensor, torch.Tensor],
    variants: dict[str, tuple],
    names: tuple[str, str] = ("output", "weights"),
    *,
    masked: bool = True,
) -> None:
    """Check the weights first, then the output.

    ``got`` and ``expected`` are ``(output, weights)`` pairs, ``names`` names them in
    messages; ``variants`` maps a mistake to its ``(output, weights)``. For the output only
    the mistakes whose weights equal the student's are considered, so that a correct
    softmax followed by a wrong product is not blamed on the softmax. ``masked``: the
    target takes a mask (an all-zero row of weights may be right).
    """
    got_output, got_weights = got
    expected_output, expected_weights = expected
    output_name, weights_name = names
    expect_close(
        got_weights,
        expected_weights,
        weights_name,
        mistakes=[(d, lambda v=v: v[1]) for d, v in variants.items()],
        hints=[sums_to_one_hint(-1, "the keys (last axis)", masked=masked)],
    )
    same_weights = {
        d: v
        for d, v in variants.items()
        if v[1].shape == got_weights.shape
        and torch.allclose(
            v[1].to(torch.float64),
            got_weights.detach().to(torch.float64),
            atol=1e-6,
            equal_nan=True,
        )
    }
    expect_close(
        got_output,
        expected_output,
        output_name,
        mistakes=[(d, lambda v=v: v[0]) for d, v in same_weights.items()],
    )
