"""Checkers for exercise 19 (contexts longer than training): RoPE scaling and attention sinks.

* ``rope_frequencies(head_dim, base=10000.0, scaling=None) -> (inv_freq (head_dim/2,),
  attention_factor)``: no scaling, position interpolation (``"linear"``, Chen et al. 2023,
  arXiv:2306.15595), NTK-aware scaling (``"ntk"``, bloc97 2023) and YaRN (``"yarn"``, Peng
  et al. 2023, arXiv:2309.00071, as Hugging Face's ``_compute_yarn_parameters``: the
  correction range from ``beta_fast`` and ``beta_slow`` rounded outwards, floor and ceil, a
  linear ramp over the pairs, the attention factor 0.1 ln s + 1).
* ``scaled_rope_scores(query, key, scaling, base=10000.0) -> (B, H, T, S)``: the scores of
  queries rotated at the last T of S positions against keys at 0 .. S - 1, with the
  student's own ``rope_frequencies``; cos and sin are multiplied by the attention factor
  (as HF's rotary embedding does), so the factor reaches the scores **squared**: the task
  that makes "the attention factor applied once" observable.
* ``streaming_mask(size, window, num_sink, device=None) -> bool (size, size)``: StreamingLLM
  (Xiao et al. 2024, arXiv:2309.17453): True where j <= i and (j < num_sink or
  i - j < window).
* ``sink_attention(query, key, value, sinks, mask=None, scale=None) -> (output, weights)``:
  gpt-oss's learned sinks: each row's softmax runs over its scores and the head's sink
  logit, whose share is then dropped (rows sum to less than 1).

The expected values are the package's (:func:`attention_course.rope_frequencies`,
:func:`attention_course.apply_rope` with ``scaling``, :func:`attention_course.streaming_mask`,
:func:`attention_course.sink_attention`); the named mistakes are computed here, each an
independent implementation with one thing wrong.
"""

from __future__ import annotations

import math

import torch

from ._answers import is_number, plain, show
from ._compare import expect_close, expect_grad, expect_meta_mask, expect_tensor, expect_tuple
from ._data import leaf, randn
from ._mistakes import says
from ._runner import TRIVIAL, Case, CaseFailed, call_student, checker


def _ref():
    import attention_course as ac

    return ac


# ---------------------------------------------------------------- rope_frequencies


def _correction_dim(rotations: float, dim: int, base: float, length: int) -> float:
    return dim * math.log(length / (rotations * 2 * math.pi)) / (2 * math.log(base))


def frequencies(head_dim: int, base: float, scaling: dict | None, variant: str | None = None):
    """``(inv_freq float64 (head_dim/2,), attention_factor)``, right (``variant=None``) or
    with one known mistake; an implementation independent of the package's."""
    i = torch.arange(0, head_dim, 2, dtype=torch.float64)
    plain_freq = base ** (-i / head_dim)
    if scaling is None or variant == "ignored":
        return plain_freq, 1.0
    kind, s = scaling["type"], float(scaling["factor"])
    if kind == "linear":
        inv = plain_freq * s if variant == "linear_multiplied" else plain_freq / s
        if variant == "linear_last_pair":  # the last pair left at its plain frequency
            inv[-1] = plain_freq[-1]
        return inv, (0.1 * math.log(s) + 1 if variant == "factor_not_one" else 1.0)
    if kind == "ntk":
        exponent = {"ntk_times": 1.0, "ntk_d_minus_1": head_dim / (head_dim - 1)}.get(
            variant, head_dim / (head_dim - 2)
        )
        new_base = base * s**exponent
        factor = 0.1 * math.log(s) + 1 if variant == "factor_not_one" else 1.0
        return new_base ** (-i / head_dim), factor
    # yarn
    fast, slow = float(scaling.get("beta_fast", 32)), float(scaling.get("beta_slow", 1))
    if variant == "betas_swapped":
        fast, slow = slow, fast
    length = scaling["original_max_len"]
    low = _correction_dim(fast, head_dim, base, length)
    high = _correction_dim(slow, head_dim, base, length)
    if variant == "round_swapped":
        low, high = math.ceil(low), math.floor(high)
    elif variant != "no_round":
        low, high = math.floor(low), math.ceil(high)
    low, high = (
        max(low, 0),
        min(high, head_dim // 2 - 1 if variant == "high_half" else head_dim - 1),
    )
    if low == high:
        high += 0.001
    pairs = torch.arange(head_dim // 2, dtype=torch.float64)
    if variant == "ramp_features":
        pairs = pairs * 2
    elif variant == "ramp_off_by_one":
        pairs = pairs + 1
    ramp = (pairs - low) / (high - low)
    if variant != "ramp_not_clamped":
        ramp = ramp.clamp(0, 1)
    keep = ramp if variant == "ramp_reversed" else 1 - ramp  # the extrapolated share
    if variant == "interpolate_all":
        keep = torch.zeros_like(keep)
    if variant == "interpolate_none":
        keep = torch.ones_like(keep)
    inv = plain_freq / s * (1 - keep) + plain_freq * keep
    factor = 0.1 * math.log(s) + 1
    if variant == "factor_ln":
        factor = math.log(s) + 1
    elif variant == "factor_sqrt":
        factor = math.sqrt(0.1 * math.log(s) + 1)
    elif variant == "factor_one":
        factor = 1.0
    return inv, factor


_FREQ_VARIANTS = {
    "ramp_reversed": "yarn-ramp-reversed",
    "no_round": "yarn-no-rounding",
    "round_swapped": "yarn-rounding-swapped",
    "interpolate_all": "yarn-interpolates-high-frequencies",
    "interpolate_none": "yarn-no-interpolation",
    "betas_swapped": "yarn-betas-swapped",
    "ramp_features": "yarn-ramp-over-features",
    "high_half": "yarn-high-clipped-at-half",
    "ramp_off_by_one": "yarn-ramp-off-by-one",
    "ramp_not_clamped": "yarn-ramp-not-clamped",
    "linear_multiplied": "linear-scaling-multiplied",
    "linear_last_pair": "linear-scaling-last-pair",
    "ntk_times": "ntk-base-times-factor",
    "ntk_d_minus_1": "ntk-exponent-d-minus-1",
    "ignored": "scaling-ignored",
}
_FACTOR_VARIANTS = {
    "factor_ln": "yarn-attention-factor",
    "factor_sqrt": "yarn-attention-factor",
    "factor_one": "yarn-attention-factor",
    "factor_not_one": "scaling-attention-factor-not-one",
    "ignored": "scaling-ignored",
}


def _call_text(head_dim, base, scaling) -> str:
    args = [str(head_dim)]
    if base != 10000.0:
        args.append(f"base={base}")
    if scaling is not None:
        args.append(f"scaling={scaling}")
    return "rope_frequencies(" + ", ".join(args) + ")"


def _frequencies_case(candidate, head_dim, scaling=None, base=10000.0):
    def run():
        want_freq, want_factor = _ref().rope_frequencies(head_dim, base, scaling)
        want_freq = want_freq.to(torch.float64)
        what = _call_text(head_dim, base, scaling)
        kwargs = {}
        if base != 10000.0:
            kwargs["base"] = base
        if scaling is not None:
            kwargs["scaling"] = dict(scaling)
        got = call_student(candidate, head_dim, what=what, **kwargs)
        got = expect_tuple(got, 2, what, ("inv_freq", "attention_factor"))
        freq = expect_tensor(got[0], f"inv_freq of {what}")
        # float32 (as HF computes them) or float64: compared to float32's precision
        mistakes = [
            (says(m), lambda v=v: frequencies(head_dim, base, scaling, v)[0])
            for v, m in _FREQ_VARIANTS.items()
        ]
        expect_close(
            freq.to(torch.float64) if freq.is_floating_point() else freq,
            want_freq,
            f"inv_freq of {what}",
            mistakes=mistakes,
            atol=1e-12,
            rtol=2e-6,
        )
        factor = plain(got[1])
        if not is_number(factor):
            raise CaseFailed(
                f"attention_factor of {what}: expected a number, got {show(factor)} "
                f"({type(got[1]).__name__})"
            )
        try:
            factor = float(factor)
        except OverflowError:  # an int too large for a float
            raise CaseFailed(
                f"attention_factor of {what}: expected {want_factor:.6g}, got {show(factor)}"
            ) from None
        if math.isclose(factor, want_factor, rel_tol=1e-6):
            return
        message = f"attention_factor of {what}: expected {want_factor:.6g}, got {show(factor)}"
        for variant, mistake in _FACTOR_VARIANTS.items():
            wrong = frequencies(head_dim, base, scaling, variant)[1]
            if not math.isclose(wrong, want_factor) and math.isclose(wrong, factor):
                raise CaseFailed(message + f"\nLikely mistake: {says(mistake)}.")
        raise CaseFailed(message)

    return run


def _yarn(factor, length, **betas):
    return {"type": "yarn", "factor": factor, "original_max_len": length, **betas}


@checker("rope_frequencies", chapter="19_longer_than_trained")
def check_rope_frequencies(candidate) -> list[Case]:
    """Check ``rope_frequencies(head_dim, base=10000.0, scaling=None) -> (inv_freq,
    attention_factor)``: none, linear, NTK-aware and YaRN scaling (as HF's)."""
    return [
        Case(
            "no scaling, head_dim 16",
            _frequencies_case(candidate, 16),
            weight=TRIVIAL,
            support=True,
        ),
        Case(
            "linear, factor 4, head_dim 32",
            _frequencies_case(candidate, 32, {"type": "linear", "factor": 4.0}),
            covers=frozenset({"scaling", "scaling=linear"}),
        ),
        Case(
            "ntk, factor 8, head_dim 64, base 500000",
            _frequencies_case(candidate, 64, {"type": "ntk", "factor": 8.0}, base=500000.0),
            covers=frozenset({"scaling", "scaling=ntk", "base"}),
        ),
        Case(
            "yarn, factor 4, head_dim 128, original length 4096",
            _frequencies_case(candidate, 128, _yarn(4.0, 4096)),
            covers=frozenset({"scaling", "scaling=yarn"}),
        ),
        Case(
            "yarn, factor 8, head_dim 64, original length 2048, base 500000",
            _frequencies_case(candidate, 64, _yarn(8.0, 2048), base=500000.0),
            covers=frozenset({"scaling", "scaling=yarn", "base"}),
        ),
        Case(
            "yarn, beta_fast 16 and beta_slow 2 given, factor 2, head_dim 64, length 1024",
            _frequencies_case(candidate, 64, _yarn(2.0, 1024, beta_fast=16.0, beta_slow=2.0)),
            covers=frozenset({"scaling", "scaling=yarn", "betas"}),
        ),
        Case(
            "yarn, factor 4, head_dim 64, original length 65536: ceil(i(beta_slow)) = 33 is "
            "above d/2 - 1",
            _frequencies_case(candidate, 64, _yarn(4.0, 65536)),
            covers=frozenset({"scaling", "scaling=yarn", "high > d/2 - 1"}),
        ),
        Case(
            "yarn, factor 1.25 (close to 1), head_dim 32, original length 64",
            _frequencies_case(candidate, 32, _yarn(1.25, 64)),
            covers=frozenset({"scaling", "scaling=yarn", "factor close to 1"}),
        ),
    ]


# ---------------------------------------------------------------- scaled_rope_scores


def _scores(query, key, scaling, base, variant=None):
    """The scores with the package's scaled RoPE, right or with one mistake."""
    ac = _ref()
    T, S, Dh = query.shape[-2], key.shape[-2], query.shape[-1]
    q_pos = torch.arange(T) if variant == "queries_at_zero" else torch.arange(S - T, S)
    if variant == "base_ignored":
        base = 10000.0
    if variant == "interleaved":  # GPT-J's layout: pair i is features 2i and 2i + 1
        inv, factor = ac.rope_frequencies(Dh, base, scaling)

        def rotate(x, positions):
            angles = positions.to(torch.float64)[:, None] * inv.to(torch.float64)
            cos, sin = angles.cos() * factor, angles.sin() * factor
            x = x.to(torch.float64)
            even, odd = x[..., 0::2], x[..., 1::2]
            pairs = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1)
            return pairs.flatten(-2)

        q, k = rotate(query, q_pos), rotate(key, torch.arange(S))
        return (q @ k.transpose(-1, -2) / math.sqrt(Dh)).to(query.dtype)
    q = ac.apply_rope(query, q_pos, base, scaling=scaling)
    k = ac.apply_rope(key, torch.arange(S), base, scaling=scaling)
    scores = q @ k.transpose(-1, -2) / (1.0 if variant == "no_sqrt" else math.sqrt(Dh))
    factor = ac.rope_frequencies(Dh, base, scaling)[1]
    if variant == "once":
        scores = scores / factor
    elif variant == "not_applied":
        scores = scores / factor**2
    return scores


_SCORE_VARIANTS = {
    "once": "yarn-factor-applied-once",
    "not_applied": "yarn-factor-not-applied",
    "queries_at_zero": "mla-queries-at-zero",
    "base_ignored": "rope-base-ignored",
    "interleaved": "rope-interleaved-layout",
    "no_sqrt": "scale-missing",
}


def _scores_case(candidate, B, H, T, S, Dh, scaling, *, seed, base=10000.0, dtype=torch.float64):
    def run():
        query = randn(B, H, T, Dh, seed=seed, dtype=dtype)
        key = randn(B, H, S, Dh, seed=seed + 1, dtype=dtype)
        expected = _scores(query, key, scaling, base)
        what = (
            f"scaled_rope_scores(query {tuple(query.shape)}, key {tuple(key.shape)}, "
            f"scaling={scaling}" + (f", base={base})" if base != 10000.0 else ")")
        )
        kwargs = {"base": base} if base != 10000.0 else {}
        got = call_student(
            candidate,
            query.clone(),
            key.clone(),
            None if scaling is None else dict(scaling),
            what=what,
            arg_names=("query", "key"),
            **kwargs,
        )
        expect_close(
            got,
            expected,
            f"the scores of {what}",
            mistakes=[
                (says(m), lambda v=v: _scores(query, key, scaling, base, v))
                for v, m in _SCORE_VARIANTS.items()
            ],
        )

    return run


@checker("scaled_rope_scores", chapter="19_longer_than_trained")
def check_scaled_rope_scores(candidate) -> list[Case]:
    """Check ``scaled_rope_scores(query, key, scaling, base=10000.0) -> (B, H, T, S)``:
    queries rotated at positions S - T .. S - 1, keys at 0 .. S - 1, cos and sin times the
    attention factor, scores q . k / sqrt(Dh)."""
    return [
        Case(
            "yarn factor 4, original length 16, T=S=6, Dh=16",
            _scores_case(candidate, 2, 2, 6, 6, 16, _yarn(4.0, 16), seed=1),
            covers=frozenset({"scaling=yarn", "B>1"}),
        ),
        Case(
            "yarn factor 8, original length 32, T=3 queries after S=12 keys, Dh=32",
            _scores_case(candidate, 1, 2, 3, 12, 32, _yarn(8.0, 32), seed=11),
            covers=frozenset({"scaling=yarn", "S!=T"}),
        ),
        Case(
            "linear factor 2, S=5, T=5, Dh=8",
            _scores_case(candidate, 1, 3, 5, 5, 8, {"type": "linear", "factor": 2.0}, seed=21),
            covers=frozenset({"scaling=linear"}),
        ),
        Case(
            "ntk factor 4, base 1000, T=1 query after S=7 keys",
            _scores_case(
                candidate, 2, 1, 1, 7, 8, {"type": "ntk", "factor": 4.0}, seed=31, base=1000.0
            ),
            covers=frozenset({"scaling=ntk", "base", "T=1", "S!=T"}),
        ),
        Case(
            "no scaling (scaling=None), T=4, S=6",
            _scores_case(candidate, 1, 2, 4, 6, 8, None, seed=41),
            weight=TRIVIAL,
            covers=frozenset({"scaling=None", "S!=T"}),
        ),
        Case(
            "float32, yarn factor 2, original length 8, T=S=5",
            _scores_case(candidate, 2, 2, 5, 5, 16, _yarn(2.0, 8), seed=51, dtype=torch.float32),
            covers=frozenset({"dtype=float32", "scaling=yarn"}),
        ),
    ]


# ---------------------------------------------------------------- streaming_mask


def _streaming_mistakes(size, window, num_sink):
    i = torch.arange(size)[:, None]
    j = torch.arange(size)[None, :]
    causal = j <= i
    sink = j < num_sink
    right = causal & (sink | (i - j < window))
    # with more sinks than the window, one sink too many (the column j = num_sink) can be
    # the same mask as a window one too wide (the column i - window): where they agree,
    # neither is named (a case where they differ names the right one)
    sink_extra = causal & ((j <= num_sink) | (i - j < window))
    window_extra = causal & (sink | (i - j <= window))
    same = torch.equal(sink_extra, window_extra)
    return [
        (says("streaming-sinks-one-too-many"), lambda: None if same else sink_extra),
        (says("streaming-not-causal"), lambda: sink | (i - j < window)),
        (says("streaming-mask-transposed"), lambda: right.T),
        (says("streaming-sinks-see-future"), lambda: (causal & (i - j < window)) | sink),
        (says("streaming-sinks-ignored"), lambda: causal & (i - j < window)),
        (says("streaming-window-one-wide"), lambda: None if same else window_extra),
        (says("streaming-window-one-narrow"), lambda: causal & (sink | (i - j < window - 1))),
        (
            says("streaming-sinks-in-window"),
            lambda: causal & (sink | (i - j < window - num_sink)),
        ),
    ]


def _streaming_case(candidate, size, window, num_sink, with_device=False):
    def run():
        expected = _ref().streaming_mask(size, window, num_sink)
        kwargs = {"device": torch.device("cpu")} if with_device else {}
        extra = ", device=torch.device('cpu')" if with_device else ""
        what = f"streaming_mask({size}, window={window}, num_sink={num_sink}{extra})"
        got = call_student(candidate, size, window, num_sink, what=what, **kwargs)
        expect_close(
            got,
            expected,
            f"the mask of {what}",
            mistakes=_streaming_mistakes(size, window, num_sink),
        )

    return run


def _streaming_meta_case(candidate):
    def run():
        what = "streaming_mask(6, 2, 1, device=torch.device('meta'))"
        got = call_student(candidate, 6, 2, 1, device=torch.device("meta"), what=what)
        expect_meta_mask(
            got,
            (6, 6),
            lambda device: (
                f"the `device` argument is ignored: {what} returned a mask on {device}; create "
                "the tensors on the requested device"
            ),
        )

    return run


@checker("streaming_mask", chapter="19_longer_than_trained")
def check_streaming_mask(candidate) -> list[Case]:
    """Check ``streaming_mask(size, window, num_sink, device=None) -> bool (size, size)``:
    True where j <= i and (j < num_sink or i - j < window)."""
    return [
        Case("size 8, window 3, 2 sinks", _streaming_case(candidate, 8, 3, 2)),
        Case("size 10, window 4, 1 sink", _streaming_case(candidate, 10, 4, 1)),
        Case(
            "size 7, window 2, 4 sinks",
            _streaming_case(candidate, 7, 2, 4),
            covers=frozenset({"num_sink>window"}),
        ),
        Case(
            "num_sink=0: the sliding window",
            _streaming_case(candidate, 6, 3, 0),
            covers=frozenset({"num_sink=0"}),
            support=True,
        ),
        Case(
            "window 9 >= size 5: the causal mask",
            _streaming_case(candidate, 5, 9, 1),
            covers=frozenset({"window>=size"}),
            support=True,
        ),
        Case(
            "size 1",
            _streaming_case(candidate, 1, 1, 1),
            weight=TRIVIAL,
            covers=frozenset({"size=1"}),
            support=True,
        ),
        Case(
            "device='cpu' given explicitly",
            _streaming_case(candidate, 6, 2, 2, with_device=True),
            covers=frozenset({"device"}),
        ),
        Case(
            "device on the 'meta' device",
            _streaming_meta_case(candidate),
            covers=frozenset({"device", "device=meta"}),
            support=True,
        ),
    ]


# ---------------------------------------------------------------- sink_attention


def _sink_variant(query, key, value, sinks, mask, scale, variant):
    """(output, weights) with one known mistake, in float64, cast back."""
    dtype = query.dtype
    q, k, v, s = (t.detach().to(torch.float64) for t in (query, key, value, sinks))
    if scale is None or variant == "scale_ignored":
        scale = q.shape[-1] ** -0.5
    scores = q @ k.transpose(-1, -2) * scale
    if variant == "one_sink":
        s = s[:1].expand(s.shape[0])
    if mask is not None and variant != "mask_after":
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.to(torch.float64)
    B, H, T, S = scores.shape
    column = s.view(1, H, 1, 1).expand(B, H, T, 1)
    if variant == "wrong_head":  # sinks along the query axis (needs T == H)
        column = s.view(1, 1, T, 1).expand(B, H, T, 1)
    if variant == "ignored":
        weights = torch.softmax(scores, dim=-1)
    elif variant == "after_softmax":
        weights = torch.softmax(scores, dim=-1) / (1 + column.exp())
    elif variant == "kept":
        weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)
    elif variant == "no_max":
        e = torch.cat([scores, column], dim=-1).exp()
        weights = (e / e.sum(-1, keepdim=True))[..., :S]
    else:
        weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :S]
    if variant == "mask_after" and mask is not None:
        if mask.dtype == torch.bool:
            weights = weights.masked_fill(~mask, 0.0)
        else:
            return None  # a float mask after the softmax: no one way to get it wrong
    out = weights[..., :S] @ v if variant == "kept" else weights @ v
    return out.to(dtype), weights.to(dtype)


_SINK_VARIANTS = {
    "ignored": "sink-ignored",
    "after_softmax": "sink-added-after-softmax",
    "kept": "sink-share-kept",
    "wrong_head": "sink-wrong-head",
    "no_max": "sink-no-max-subtraction",
    "one_sink": "sink-one-for-all-heads",
    "scale_ignored": "sink-scale-ignored",
    "mask_after": "sink-mask-after-softmax",
}


def _sink_inputs(B, H, T, S, Dk, Dv, seed, dtype, big=False):
    q = randn(B, H, T, Dk, seed=seed, dtype=dtype)
    if big:
        q = q * 2000
    k = randn(B, H, S, Dk, seed=seed + 1, dtype=dtype)
    v = randn(B, H, S, Dv, seed=seed + 2, dtype=dtype)
    sinks = randn(H, seed=seed + 3, dtype=dtype) * 2
    if big:  # each head's sink as large as its largest score: the sink keeps a real share
        scores = q.to(torch.float64) @ k.to(torch.float64).transpose(-1, -2) / math.sqrt(Dk)
        sinks = scores.amax(dim=(0, 2, 3)).to(dtype)
    return q, k, v, sinks


def _sink_case(
    candidate,
    B,
    H,
    T,
    S,
    Dk,
    Dv,
    *,
    seed,
    mask=None,
    scale=None,
    dtype=torch.float64,
    big=False,
):
    def run():
        q, k, v, sinks = _sink_inputs(B, H, T, S, Dk, Dv, seed, dtype, big)
        expected = _ref().sink_attention(q, k, v, sinks, mask=mask, scale=scale)
        kwargs = {}
        if mask is not None:
            kwargs["mask"] = mask.clone()
        if scale is not None:
            kwargs["scale"] = scale
        what = (
            f"sink_attention(query {tuple(q.shape)}, key {tuple(k.shape)}, value "
            f"{tuple(v.shape)}, sinks ({H},)"
            + (
                f", mask {str(mask.dtype).replace('torch.', '')} {tuple(mask.shape)}"
                if mask is not None
                else ""
            )
            + (f", scale={scale}" if scale is not None else "")
            + ")"
        )
        got = call_student(
            candidate,
            q.clone(),
            k.clone(),
            v.clone(),
            sinks.clone(),
            what=what,
            arg_names=("query", "key", "value", "sinks"),
            **kwargs,
        )
        got = expect_tuple(got, 2, what, ("output", "weights"))

        def mistakes(which):
            return [
                (says(m), lambda x=x: _sink_variant(q, k, v, sinks, mask, scale, x)[which])
                for x, m in _SINK_VARIANTS.items()
            ]

        expect_close(got[1], expected[1], f"the weights of {what}", mistakes=mistakes(1))
        expect_close(got[0], expected[0], f"the output of {what}", mistakes=mistakes(0))

    return run


def _sink_grad_case(candidate):
    def run():
        q0, k0, v0, s0 = _sink_inputs(2, 2, 3, 4, 4, 3, 71, torch.float64)
        mine = [leaf(t) for t in (q0, k0, v0, s0)]
        ref = [leaf(t) for t in (q0, k0, v0, s0)]
        what = "sink_attention(query, key, value, sinks) with requires_grad"
        got = call_student(candidate, *mine, what=what)
        got = expect_tuple(got, 2, what, ("output", "weights"))
        out = expect_tensor(got[0], f"the output of {what}")
        if not out.requires_grad:
            raise CaseFailed(
                f"the output of {what} does not require grad: compute it from the inputs with "
                "tensor operations (the sinks are learned: the gradient must reach them)"
            )
        upstream = randn(*out.shape, seed=72)
        (out * upstream).sum().backward()
        (_ref().sink_attention(*ref)[0] * upstream).sum().backward()
        for name, a, b in zip(("query", "key", "value", "sinks"), mine, ref):
            expect_grad(a.grad, b.grad, name)

    return run


@checker("sink_attention", chapter="19_longer_than_trained")
def check_sink_attention(candidate) -> list[Case]:
    """Check ``sink_attention(query, key, value, sinks, mask=None, scale=None) -> (output
    (B, H, T, Dv), weights (B, H, T, S))``: each row's softmax over its scores and the
    head's sink logit, the sink's column dropped."""
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    masked_row = torch.ones(4, 6, dtype=torch.bool)
    masked_row[2] = False  # one query sees no key: the sink takes the whole row
    float_mask = randn(3, 5, seed=99)
    return [
        Case(
            "B=2, H=3, T=4, S=6, Dk=8, Dv=5",
            _sink_case(candidate, 2, 3, 4, 6, 8, 5, seed=1),
            covers=frozenset({"B>1", "S!=T", "Dk!=Dv"}),
        ),
        Case(
            "a causal bool mask (True = may attend), T=S=5, H=2",
            _sink_case(candidate, 1, 2, 5, 5, 4, 4, seed=11, mask=causal),
            covers=frozenset({"mask", "mask=bool"}),
        ),
        Case(
            "T = H = 3: one sink per head, not per query",
            _sink_case(candidate, 1, 3, 3, 5, 4, 4, seed=21),
            covers=frozenset({"T=H"}),
        ),
        Case(
            "a fully masked row: its weights are all 0 (the sink takes the row)",
            _sink_case(candidate, 1, 2, 4, 6, 4, 3, seed=31, mask=masked_row),
            covers=frozenset({"mask", "mask=bool", "mask=fully-masked-row"}),
        ),
        Case(
            "a float mask added to the scores, scale=0.3",
            _sink_case(candidate, 2, 2, 3, 5, 4, 4, seed=41, mask=float_mask, scale=0.3),
            covers=frozenset({"mask", "mask=float", "scale"}),
        ),
        Case(
            "very large scores (in the thousands)",
            _sink_case(candidate, 1, 2, 3, 4, 4, 4, seed=51, big=True),
            covers=frozenset({"large scores"}),
        ),
        Case(
            "H=1, T=1",
            _sink_case(candidate, 1, 1, 1, 3, 4, 2, seed=61),
            weight=TRIVIAL,
            covers=frozenset({"H=1", "T=1"}),
        ),
        Case(
            "float32, B=2, H=2, T=3, S=4",
            _sink_case(candidate, 2, 2, 3, 4, 4, 4, seed=81, dtype=torch.float32),
            covers=frozenset({"dtype=float32"}),
        ),
        Case(
            "gradients reach query, key, value and sinks",
            _sink_grad_case(candidate),
            covers=frozenset({"grad"}),
        ),
    ]
