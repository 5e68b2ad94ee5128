"""Exercise 19: ``rope_frequencies``, ``scaled_rope_scores``, ``streaming_mask`` and
``sink_attention``, right and with one mistake each, written as a student would (without the
package's references, which exercise 19 does not hand out)."""

import math

import numpy as np
import torch

# ---------------------------------------------------------------- rope_frequencies


def _frequencies(
    head_dim,
    base=10000.0,
    scaling=None,
    *,
    ramp_reversed=False,
    rounding="outwards",
    interpolate_all=False,
    betas_swapped=False,
    factor_rule="yarn",
    linear_multiplies=False,
    ntk_plain=False,
    ntk_exponent=None,
    linear_last_unscaled=False,
    high_limit=None,
    ramp_shift=0,
    clamp=True,
):
    i = torch.arange(0, head_dim, 2, dtype=torch.float64)
    inv = base ** (-i / head_dim)
    if scaling is None:
        return inv, 1.0
    s = scaling["factor"]
    if scaling["type"] == "linear":
        scaled = inv * s if linear_multiplies else inv / s
        if linear_last_unscaled:
            scaled[-1] = inv[-1]
        return scaled, 1.0
    if scaling["type"] == "ntk":
        exponent = ntk_exponent or head_dim / (head_dim - 2)
        new_base = base * s if ntk_plain else base * s**exponent
        return new_base ** (-i / head_dim), 1.0
    fast, slow = scaling.get("beta_fast", 32), scaling.get("beta_slow", 1)
    if betas_swapped:
        fast, slow = slow, fast
    length = scaling["original_max_len"]

    def correction(rotations):
        return head_dim * math.log(length / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction(fast), correction(slow)
    if rounding == "outwards":
        low, high = math.floor(low), math.ceil(high)
    elif rounding == "inwards":
        low, high = math.ceil(low), math.floor(high)
    low, high = max(low, 0), min(high, high_limit or head_dim - 1)
    if low == high:
        high += 0.001
    pairs = torch.arange(head_dim // 2, dtype=torch.float64) + ramp_shift
    ramp = (pairs - low) / (high - low)
    if clamp:
        ramp = ramp.clamp(0, 1)
    extrapolate = ramp if ramp_reversed else 1 - ramp
    if interpolate_all:
        extrapolate = torch.zeros_like(extrapolate)
    inv = inv / s * (1 - extrapolate) + inv * extrapolate
    factor = {"yarn": 0.1 * math.log(s) + 1, "ln": math.log(s) + 1, "one": 1.0}[factor_rule]
    return inv, factor


def reference_rope_frequencies(head_dim, base=10000.0, scaling=None):
    """Right: HF's `_compute_yarn_parameters` for yarn, base^(-2i/d) / s, base * s^(d/(d-2))."""
    return _frequencies(head_dim, base, scaling)


def rope_frequencies_numpy_factor(head_dim, base=10000.0, scaling=None):
    """Right, with the attention factor as a numpy float64 (accepted)."""
    inv, factor = _frequencies(head_dim, base, scaling)
    return inv.float(), np.float64(factor)


def rope_frequencies_ramp_reversed(head_dim, base=10000.0, scaling=None):
    """The ramp runs the wrong way: high frequencies interpolated, low ones kept."""
    return _frequencies(head_dim, base, scaling, ramp_reversed=True)


def rope_frequencies_no_rounding(head_dim, base=10000.0, scaling=None):
    """The correction range not rounded (floor(low), ceil(high) missing)."""
    return _frequencies(head_dim, base, scaling, rounding="none")


def rope_frequencies_rounding_inwards(head_dim, base=10000.0, scaling=None):
    """ceil(low) and floor(high) instead of floor(low) and ceil(high)."""
    return _frequencies(head_dim, base, scaling, rounding="inwards")


def rope_frequencies_interpolate_all(head_dim, base=10000.0, scaling=None):
    """YaRN that divides every frequency by s (the high ones too): position interpolation."""
    return _frequencies(head_dim, base, scaling, interpolate_all=True)


def rope_frequencies_betas_swapped(head_dim, base=10000.0, scaling=None):
    """low from beta_slow, high from beta_fast."""
    return _frequencies(head_dim, base, scaling, betas_swapped=True)


def rope_frequencies_factor_ln(head_dim, base=10000.0, scaling=None):
    """YaRN's attention factor ln(s) + 1 (the 0.1 missing)."""
    return _frequencies(head_dim, base, scaling, factor_rule="ln")


def rope_frequencies_linear_multiplies(head_dim, base=10000.0, scaling=None):
    """Linear scaling multiplies the frequencies by s."""
    return _frequencies(head_dim, base, scaling, linear_multiplies=True)


def rope_frequencies_ntk_plain(head_dim, base=10000.0, scaling=None):
    """NTK-aware scaling with base * s instead of base * s^(d/(d-2))."""
    return _frequencies(head_dim, base, scaling, ntk_plain=True)


def rope_frequencies_ntk_d_minus_1(head_dim, base=10000.0, scaling=None):
    """NTK-aware scaling with base * s^(d/(d-1)) instead of s^(d/(d-2))."""
    return _frequencies(head_dim, base, scaling, ntk_exponent=head_dim / (head_dim - 1))


def rope_frequencies_ramp_off_by_one(head_dim, base=10000.0, scaling=None):
    """YaRN's ramp (i + 1 - low) / (high - low): pairs counted from 1."""
    return _frequencies(head_dim, base, scaling, ramp_shift=1)


def rope_frequencies_ramp_not_clamped(head_dim, base=10000.0, scaling=None):
    """YaRN's ramp (i - low) / (high - low) without the clamp to [0, 1]."""
    return _frequencies(head_dim, base, scaling, clamp=False)


def rope_frequencies_linear_last_pair(head_dim, base=10000.0, scaling=None):
    """Linear scaling that leaves the last pair at its plain frequency."""
    return _frequencies(head_dim, base, scaling, linear_last_unscaled=True)


def rope_frequencies_high_clipped_at_half(head_dim, base=10000.0, scaling=None):
    """YaRN's high clipped at d/2 - 1 (the last pair) instead of d - 1."""
    return _frequencies(head_dim, base, scaling, high_limit=head_dim // 2 - 1)


# ---------------------------------------------------------------- scaled_rope_scores


def _rotate(x, positions, inv_freq, factor):
    half = x.shape[-1] // 2
    angles = positions.to(torch.float64)[:, None] * inv_freq.to(torch.float64)
    cos, sin = (angles.cos() * factor).to(x.dtype), (angles.sin() * factor).to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _scores(query, key, scaling, base, *, factor_power=2, from_zero=False):
    T, S, Dh = query.shape[-2], key.shape[-2], query.shape[-1]
    inv, factor = reference_rope_frequencies(Dh, base, scaling)
    q_pos = torch.arange(T) if from_zero else torch.arange(S - T, S)
    q = _rotate(query, q_pos, inv, 1.0)
    k = _rotate(key, torch.arange(S), inv, 1.0)
    return q @ k.transpose(-1, -2) / math.sqrt(Dh) * factor**factor_power


def reference_scaled_rope_scores(query, key, scaling, base=10000.0):
    """Right: cos and sin times the attention factor for q and k, so the scores get its
    square."""
    T, S, Dh = query.shape[-2], key.shape[-2], query.shape[-1]
    inv, factor = reference_rope_frequencies(Dh, base, scaling)
    q = _rotate(query, torch.arange(S - T, S), inv, factor)
    k = _rotate(key, torch.arange(S), inv, factor)
    return q @ k.transpose(-1, -2) / math.sqrt(Dh)


def scaled_rope_scores_factor_once(query, key, scaling, base=10000.0):
    """Multiplies the scores by the attention factor once."""
    return _scores(query, key, scaling, base, factor_power=1)


def scaled_rope_scores_no_factor(query, key, scaling, base=10000.0):
    """Never applies the attention factor."""
    return _scores(query, key, scaling, base, factor_power=0)


def scaled_rope_scores_queries_at_zero(query, key, scaling, base=10000.0):
    """Rotates the queries at 0 .. T - 1 although they are the last T of S positions."""
    return _scores(query, key, scaling, base, from_zero=True)


def scaled_rope_scores_base_ignored(query, key, scaling, base=10000.0):
    """Rotates with base 10000 whatever `base` is."""
    return reference_scaled_rope_scores(query, key, scaling)


def scaled_rope_scores_interleaved(query, key, scaling, base=10000.0):
    """GPT-J's interleaved pairs (2i, 2i + 1) instead of the half-split (i, i + Dh/2)."""
    T, S, Dh = query.shape[-2], key.shape[-2], query.shape[-1]
    inv, factor = reference_rope_frequencies(Dh, base, scaling)

    def rotate(x, positions):
        angles = positions.to(torch.float64)[:, None] * inv
        cos, sin = (angles.cos() * factor).to(x.dtype), (angles.sin() * factor).to(x.dtype)
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack([even * cos - odd * sin, odd * cos + even * sin], -1).flatten(-2)

    q, k = rotate(query, torch.arange(S - T, S)), rotate(key, torch.arange(S))
    return q @ k.transpose(-1, -2) / math.sqrt(Dh)


def scaled_rope_scores_unscaled(query, key, scaling, base=10000.0):
    """The 1/sqrt(Dh) forgotten."""
    return reference_scaled_rope_scores(query, key, scaling, base) * math.sqrt(query.shape[-1])


# ---------------------------------------------------------------- streaming_mask


def _streaming(size, window, num_sink, device=None, *, rule="right"):
    i = torch.arange(size, device=device)[:, None]
    j = torch.arange(size, device=device)[None, :]
    causal, sink = j <= i, j < num_sink
    if rule == "sinks see the future":
        return (causal & (i - j < window)) | sink
    if rule == "no sinks":
        return causal & (i - j < window)
    if rule == "window <=":
        return causal & (sink | (i - j <= window))
    if rule == "sinks <=":
        return causal & ((j <= num_sink) | (i - j < window))
    if rule == "not causal":
        return sink | (i - j < window)
    if rule == "transposed":
        return (causal & (sink | (i - j < window))).T
    return causal & (sink | (i - j < window))


def reference_streaming_mask(size, window, num_sink, device=None):
    """Right: j <= i and (j < num_sink or i - j < window)."""
    return _streaming(size, window, num_sink, device)


def streaming_mask_sinks_see_future(size, window, num_sink, device=None):
    """The sink columns are True in every row, above the diagonal too."""
    return _streaming(size, window, num_sink, device, rule="sinks see the future")


def streaming_mask_no_sinks(size, window, num_sink, device=None):
    """Ignores num_sink: a plain sliding window."""
    return _streaming(size, window, num_sink, device, rule="no sinks")


def streaming_mask_window_too_wide(size, window, num_sink, device=None):
    """i - j <= window: one token too many."""
    return _streaming(size, window, num_sink, device, rule="window <=")


def streaming_mask_sinks_one_too_many(size, window, num_sink, device=None):
    """j <= num_sink: one sink too many."""
    return _streaming(size, window, num_sink, device, rule="sinks <=")


def streaming_mask_not_causal(size, window, num_sink, device=None):
    """j <= i forgotten: the sinks and the window without the causal part."""
    return _streaming(size, window, num_sink, device, rule="not causal")


def streaming_mask_transposed(size, window, num_sink, device=None):
    """The right mask, transposed (keys on the rows)."""
    return _streaming(size, window, num_sink, device, rule="transposed")


# ---------------------------------------------------------------- sink_attention


def _sink(query, key, value, sinks, mask=None, scale=None, *, rule="right"):
    if scale is None or rule == "scale ignored":
        scale = query.shape[-1] ** -0.5
    scores = query @ key.transpose(-1, -2) * scale
    if rule == "one sink":
        sinks = sinks[0].expand(sinks.shape[0])
    if mask is not None and rule != "mask after":
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    B, H, T, S = scores.shape
    column = sinks.view(1, H, 1, 1).expand(B, H, T, 1)
    if rule == "wrong axis":
        column = sinks.view(1, 1, -1, 1).expand(B, H, T, 1)
    if rule == "ignored":
        weights = torch.softmax(scores, dim=-1)
    elif rule == "after":
        weights = torch.softmax(scores, dim=-1) / (1 + column.exp())
    elif rule == "kept":
        weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)
        return weights[..., :S] @ value, weights
    elif rule == "no max":
        e = torch.cat([scores, column], dim=-1).exp()
        weights = (e / e.sum(-1, keepdim=True))[..., :S]
    else:
        weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :S]
    if rule == "mask after" and mask is not None and mask.dtype == torch.bool:
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ value, weights


def sink_attention_one_sink(query, key, value, sinks, mask=None, scale=None):
    """sinks[0] for every head."""
    return _sink(query, key, value, sinks, mask, scale, rule="one sink")


def sink_attention_scale_ignored(query, key, value, sinks, mask=None, scale=None):
    """Always scales by 1/sqrt(Dk), even when `scale` is given."""
    return _sink(query, key, value, sinks, mask, scale, rule="scale ignored")


def sink_attention_mask_after_softmax(query, key, value, sinks, mask=None, scale=None):
    """The softmax over the unmasked [scores | sink], then the masked weights zeroed."""
    return _sink(query, key, value, sinks, mask, scale, rule="mask after")


def reference_sink_attention(query, key, value, sinks, mask=None, scale=None):
    """Right: softmax over [scores | sink], the sink's column dropped."""
    return _sink(query, key, value, sinks, mask, scale)


def sink_attention_ignored(query, key, value, sinks, mask=None, scale=None):
    """Ignores the sinks: a plain softmax."""
    return _sink(query, key, value, sinks, mask, scale, rule="ignored")


def sink_attention_after_softmax(query, key, value, sinks, mask=None, scale=None):
    """Softmax over the scores, then divided by 1 + exp(sink)."""
    return _sink(query, key, value, sinks, mask, scale, rule="after")


def sink_attention_column_kept(query, key, value, sinks, mask=None, scale=None):
    """Returns the weights with the sink's column, (B, H, T, S + 1)."""
    return _sink(query, key, value, sinks, mask, scale, rule="kept")


def sink_attention_wrong_axis(query, key, value, sinks, mask=None, scale=None):
    """sinks.view(1, 1, -1, 1): one sink per query row instead of per head (raises unless
    T == H)."""
    return _sink(query, key, value, sinks, mask, scale, rule="wrong axis")


def sink_attention_no_max(query, key, value, sinks, mask=None, scale=None):
    """exp without subtracting the row's maximum: inf / inf = NaN for large scores."""
    return _sink(query, key, value, sinks, mask, scale, rule="no max")


def sink_attention_detached(query, key, value, sinks, mask=None, scale=None):
    """Detaches the sinks: right values, but a learned sink gets no gradient."""
    return _sink(query, key, value, sinks.detach(), mask, scale)


CATALOGUE = [
    ("rope_frequencies", "ramp reversed", rope_frequencies_ramp_reversed, "yarn-ramp-reversed"),
    ("rope_frequencies", "no rounding", rope_frequencies_no_rounding, "yarn-no-rounding"),
    (
        "rope_frequencies",
        "rounding inwards",
        rope_frequencies_rounding_inwards,
        "yarn-rounding-swapped",
    ),
    (
        "rope_frequencies",
        "interpolates all",
        rope_frequencies_interpolate_all,
        "yarn-interpolates-high-frequencies",
    ),
    ("rope_frequencies", "betas swapped", rope_frequencies_betas_swapped, "yarn-betas-swapped"),
    ("rope_frequencies", "factor ln s + 1", rope_frequencies_factor_ln, "yarn-attention-factor"),
    (
        "rope_frequencies",
        "linear multiplies",
        rope_frequencies_linear_multiplies,
        "linear-scaling-multiplied",
    ),
    ("rope_frequencies", "ntk base * s", rope_frequencies_ntk_plain, "ntk-base-times-factor"),
    (
        "scaled_rope_scores",
        "factor once",
        scaled_rope_scores_factor_once,
        "yarn-factor-applied-once",
    ),
    ("scaled_rope_scores", "no factor", scaled_rope_scores_no_factor, "yarn-factor-not-applied"),
    (
        "scaled_rope_scores",
        "queries at zero",
        scaled_rope_scores_queries_at_zero,
        "mla-queries-at-zero",
    ),
    (
        "streaming_mask",
        "sinks see the future",
        streaming_mask_sinks_see_future,
        "streaming-sinks-see-future",
    ),
    ("streaming_mask", "no sinks", streaming_mask_no_sinks, "streaming-sinks-ignored"),
    (
        "streaming_mask",
        "window one too wide",
        streaming_mask_window_too_wide,
        "streaming-window-one-wide",
    ),
    ("sink_attention", "sinks ignored", sink_attention_ignored, "sink-ignored"),
    ("sink_attention", "after softmax", sink_attention_after_softmax, "sink-added-after-softmax"),
    ("sink_attention", "sink column kept", sink_attention_column_kept, "sink-share-kept"),
    ("sink_attention", "sinks per query", sink_attention_wrong_axis, "sink-wrong-head"),
    ("sink_attention", "no max subtraction", sink_attention_no_max, "sink-no-max-subtraction"),
    ("sink_attention", "sinks detached", sink_attention_detached, "sinks"),
    ("rope_frequencies", "ntk d/(d-1)", rope_frequencies_ntk_d_minus_1, "ntk-exponent-d-minus-1"),
    (
        "rope_frequencies",
        "ramp off by one",
        rope_frequencies_ramp_off_by_one,
        "yarn-ramp-off-by-one",
    ),
    (
        "rope_frequencies",
        "ramp not clamped",
        rope_frequencies_ramp_not_clamped,
        "yarn-ramp-not-clamped",
    ),
    (
        "rope_frequencies",
        "linear last pair unscaled",
        rope_frequencies_linear_last_pair,
        "linear-scaling-last-pair",
    ),
    (
        "rope_frequencies",
        "high clipped at d/2 - 1",
        rope_frequencies_high_clipped_at_half,
        "yarn-high-clipped-at-half",
    ),
    (
        "streaming_mask",
        "one sink too many",
        streaming_mask_sinks_one_too_many,
        "streaming-sinks-one-too-many",
    ),
    ("streaming_mask", "not causal", streaming_mask_not_causal, "streaming-not-causal"),
    ("streaming_mask", "transposed", streaming_mask_transposed, "streaming-mask-transposed"),
    ("sink_attention", "one sink for all heads", sink_attention_one_sink, "sink-one-for-all-heads"),
    ("sink_attention", "scale ignored", sink_attention_scale_ignored, "sink-scale-ignored"),
    ("scaled_rope_scores", "base ignored", scaled_rope_scores_base_ignored, "rope-base-ignored"),
    (
        "scaled_rope_scores",
        "interleaved pairs",
        scaled_rope_scores_interleaved,
        "rope-interleaved-layout",
    ),
    ("scaled_rope_scores", "no 1/sqrt(Dh)", scaled_rope_scores_unscaled, "scale-missing"),
    (
        "sink_attention",
        "mask after the softmax",
        sink_attention_mask_after_softmax,
        "sink-mask-after-softmax",
    ),
]


def rope_frequencies_float32_hf_style(head_dim, base=10000.0, scaling=None):
    """Right, computed in float32 the way HF's `_compute_yarn_parameters` does (accepted:
    the check compares to float32's precision)."""
    dim = head_dim
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    if scaling is None:
        return 1.0 / pos_freqs, 1.0
    s = scaling["factor"]
    if scaling["type"] == "linear":
        return 1.0 / pos_freqs / s, 1.0
    if scaling["type"] == "ntk":
        new_base = base * s ** (dim / (dim - 2))
        return 1.0 / (new_base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)), 1.0
    length = scaling["original_max_len"]

    def correction(rotations):
        return (dim * math.log(length / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction(scaling.get("beta_fast") or 32)), 0)
    high = min(math.ceil(correction(scaling.get("beta_slow") or 1)), dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv = (1.0 / (s * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv, 0.1 * math.log(s) + 1.0
