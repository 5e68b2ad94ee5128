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


def _masked(values, T, S):
    d, _ = _distance(T, S)
    return values.masked_fill(d < 0, float("-inf"))


def alibi_bias_half_slope(slopes, T, S=None):
    """-0.5 * slope * distance: half the penalty."""
    d, S = _distance(T, S)
    return _masked(-0.5 * slopes[:, None, None] * d.to(slopes.dtype), T, S)


def alibi_bias_reciprocal(slopes, T, S=None):
    """-distance / slope: the slope divides instead of multiplying."""
    d, S = _distance(T, S)
    return _masked(-d.to(slopes.dtype) / slopes[:, None, None], T, S)


def alibi_bias_log_distance(slopes, T, S=None):
    """-slope * log(1 + distance): a logarithmic penalty."""
    d, S = _distance(T, S)
    return _masked(-slopes[:, None, None] * torch.log1p(d.clamp(min=0).to(slopes.dtype)), T, S)


def alibi_bias_key_position(slopes, T, S=None):
    """slope * j (BLOOM's trick): right up to a constant per row, which softmax ignores."""
    d, S = _distance(T, S)
    j = torch.arange(S).to(slopes.dtype)
    return _masked(slopes[:, None, None] * j.expand(T, S), T, S)


def alibi_bias_minus_1e9(slopes, T, S=None):
    """-1e9 on future keys instead of -inf (or the dtype's most negative number)."""
    d, _ = _distance(T, S)
    return (-slopes[:, None, None] * d.to(slopes.dtype)).masked_fill(d < 0, -1e9)


def alibi_bias_off_by_one(slopes, T, S=None):
    """-slope * (distance + 1): the own key already penalised."""
    d, S = _distance(T, S)
    return _masked(-slopes[:, None, None] * (d + 1).to(slopes.dtype), T, S)


def alibi_bias_diagonal_masked(slopes, T, S=None):
    """``kpos >= qpos`` masked: the query's own key hidden too."""
    d, _ = _distance(T, S)
    return (-slopes[:, None, None] * d.to(slopes.dtype)).masked_fill(d <= 0, float("-inf"))


def alibi_bias_mask_without_offset(slopes, T, S=None):
    """The right bias, but the mask ``triu(1)`` of (T, S): keys j > i hidden, not j > i + S - T."""
    d, S = _distance(T, S)
    bias = -slopes[:, None, None] * d.to(slopes.dtype)
    return bias.masked_fill(torch.ones(T, S, dtype=torch.bool).triu(1), float("-inf"))


def alibi_bias_nan_future(slopes, T, S=None):
    """NaN on future keys instead of -inf."""
    d, _ = _distance(T, S)
    return (-slopes[:, None, None] * d.to(slopes.dtype)).masked_fill(d < 0, float("nan"))


CATALOGUE = [
    ("alibi_bias", "rewards distance", alibi_bias_rewards_distance, "rewards distance"),
    ("alibi_bias", "transposed", alibi_bias_transposed, "transposed"),
    ("alibi_bias", "no causal mask", alibi_bias_no_mask, "future keys are not masked"),
    ("alibi_bias", "future keys 0", alibi_bias_future_zero, "future keys are not masked"),
    ("alibi_bias", "queries first", alibi_bias_first_queries, "the *last* T of the S"),
    ("alibi_bias", "slopes on the wrong axis", alibi_bias_head_axis, "wrong axis"),
    ("alibi_bias", "half the slope", alibi_bias_half_slope, "half the reference's"),
    ("alibi_bias", "distance / slope", alibi_bias_reciprocal, "divided the distance"),
    ("alibi_bias", "log distance", alibi_bias_log_distance, "logarithm"),
    ("alibi_bias", "slope * j", alibi_bias_key_position, "constant along each row"),
    ("alibi_bias", "-1e9 for -inf", alibi_bias_minus_1e9, "large finite number"),
    ("alibi_bias", "distance + 1", alibi_bias_off_by_one, "off by one"),
    ("alibi_bias", "diagonal masked", alibi_bias_diagonal_masked, "own key is masked"),
    ("alibi_bias", "mask triu(1) with S > T", alibi_bias_mask_without_offset, "causal mask hides"),
    ("alibi_bias", "NaN on future keys", alibi_bias_nan_future, "future keys hold NaN"),
]
