"""Buggy ALiBi biases (exercise 14, ``alibi_bias(slopes, T, S=None) -> (H, T, S)``)."""

import torch


def reference_alibi_bias(slopes, T, S=None):
    """Right: -slope * (how far back the key is), -inf on future keys."""
    S = T if S is None else S
    distance = torch.arange(S - T, S)[:, None] - torch.arange(S)[None, :]  # (T, S)
    bias = -slopes[:, None, None] * distance.to(slopes.dtype)  # (H, T, S)
    return bias.masked_fill(distance < 0, float("-inf"))


def _distance(T, S):
    S = T if S is None else S
    return torch.arange(S - T, S)[:, None] - torch.arange(S)[None, :], S


def alibi_bias_rewards_distance(slopes, T, S=None):
    """+slope * distance: a far key scores higher than a near one (the sign)."""
    d, _ = _distance(T, S)
    return (slopes[:, None, None] * d.to(slopes.dtype)).masked_fill(d < 0, float("-inf"))


def alibi_bias_transposed(slopes, T, S=None):
    """Distance j - i with the mask on the other side: the penalty on future keys."""
    d, _ = _distance(T, S)
    bias = -slopes[:, None, None] * (-d).to(slopes.dtype)
    return bias.masked_fill(d > 0, float("-inf"))


def alibi_bias_no_mask(slopes, T, S=None):
    """-slope * |i - j|: future keys get a finite bias (no causal mask)."""
    d, _ = _distance(T, S)
    return -slopes[:, None, None] * d.abs().to(slopes.dtype)


def alibi_bias_future_zero(slopes, T, S=None):
    """The package's raw bias (future keys 0), the causal mask forgotten."""
    d, _ = _distance(T, S)
    return -slopes[:, None, None] * d.clamp(min=0).to(slopes.dtype)


def alibi_bias_first_queries(slopes, T, S=None):
    """Queries at positions 0 .. T - 1 instead of the last T of S."""
    S = T if S is None else S
    d = torch.arange(T)[:, None] - torch.arange(S)[None, :]
    return (-slopes[:, None, None] * d.to(slopes.dtype)).masked_fill(d < 0, float("-inf"))


def alibi_bias_head_axis(slopes, T, S=None):
    """Slopes broadcast on the middle axis: (T, H, S), the heads and queries swapped."""
    d, _ = _distance(T, S)
    bias = -slopes[None, :, None] * d[:, None, :].to(slopes.dtype)  # (T, H, S)
    return bias.masked_fill((d < 0)[:, None, :], float("-inf"))


CATALOGUE = [
    ("alibi_bias", "rewards distance", alibi_bias_rewards_distance, "rewards distance"),
    ("alibi_bias", "transposed", alibi_bias_transposed, "transposed"),
    ("alibi_bias", "no causal mask", alibi_bias_no_mask, "future keys are not masked"),
    ("alibi_bias", "future keys 0", alibi_bias_future_zero, "future keys are not masked"),
    ("alibi_bias", "queries first", alibi_bias_first_queries, "the *last* T of the S"),
    ("alibi_bias", "slopes on the wrong axis", alibi_bias_head_axis, "wrong axis"),
]
