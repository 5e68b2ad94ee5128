"""Shared by the attention checkers: the one simulator of attention with a known mistake
switched on (`attend` for the weights and the weighted sum, `attention_variant` for a
multi-head module around it), and the comparison of (weights, output) pairs that blames
the weights first."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

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


def attention_variant(
    module,
    query,
    key,
    value,
    mask=None,
    *,
    split="ok",
    merge="ok",
    scale="d_head",
    out_proj=True,
    bias=True,
    values="w_v",
    **attend_kwargs,
):
    """Multi-head attention with ``module``'s weights (``w_q``, ``w_k``, ``w_v``, ``w_o``,
    ``num_heads``) and one mistake switched on; returns ``(output, weights)``.

    ``split`` / ``merge``: "ok", "no-transpose" (a bare reshape between (B, T, D) and
    (B, H, T, Dh)) or "interleaved" (features cut as (Dh, H)); ``scale``: "d_head",
    "d_model" or "none"; ``out_proj=False`` skips ``w_o``; ``bias=False`` drops the
    layers' biases; ``values="w_k"`` projects the values with ``w_k``; the rest goes to
    `attend` (``dim``, ``after``, ``invert``, ``fill``). ``mask`` is what `attend` takes
    (bool, True = may attend, or an additive float mask). Used by the checkers of
    ``MultiHeadAttention`` (exercise 06) and ``CausalSelfAttention`` (exercise 13), so that a
    mistake is simulated, and named, the same way in both.
    """
    H, D = module.num_heads, module.w_q.out_features
    Dh = D // H

    def linear(layer, t):
        return F.linear(t, layer.weight, layer.bias if bias else None)

    def split_(t):
        B, L, _ = t.shape
        if split == "no-transpose":
            return t.reshape(B, H, L, Dh)  # (B, T, D) read straight as (B, H, T, Dh)
        if split == "interleaved":
            return t.reshape(B, L, Dh, H).permute(0, 3, 1, 2)  # (B, T, Dh, H) -> (B, H, T, Dh)
        return t.reshape(B, L, H, Dh).transpose(1, 2)  # (B, T, D) -> (B, H, T, Dh)

    def merge_(t):
        B, _, L, _ = t.shape
        if merge == "no-transpose":
            return t.reshape(B, L, D)  # (B, H, T, Dh) read straight as (B, T, D)
        if merge == "interleaved":
            return t.permute(0, 2, 3, 1).reshape(B, L, D)  # (B, T, Dh, H) -> (B, T, D)
        return t.transpose(1, 2).reshape(B, L, D)  # (B, H, T, Dh) -> (B, T, D)

    value_layer = module.w_k if values == "w_k" else module.w_v
    q, k = split_(linear(module.w_q, query)), split_(linear(module.w_k, key))
    v = split_(linear(value_layer, value))
    factor = {"d_head": 1 / math.sqrt(Dh), "d_model": 1 / math.sqrt(D), "none": 1.0}[scale]
    heads, weights = attend(q @ k.transpose(-2, -1) * factor, v, mask, **attend_kwargs)
    out = merge_(heads)
    return (linear(module.w_o, out) if out_proj else out), weights


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
