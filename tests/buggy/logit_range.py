"""Buggy QK-norm and soft-capped attention (exercise 20): ``qk_norm_attention(q, k, v,
q_weight, k_weight, eps=1e-6)`` and ``softcap_attention(q, k, v, cap)``, q, k, v
``(B, H, T, Dh)``."""

import math

import torch

from attention_course import apply_rope
from attention_course.checks.logit_range import qk_norm_reference, softcap_reference

__all__ = ["qk_norm_reference", "softcap_reference"]


def _rms(x, w, eps, dims=(-1,)):
    return x * torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + eps) * w


def _attend(q, k, v, scale=True):
    T = q.shape[-2]
    scores = q @ k.transpose(-2, -1)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1) @ v


def qk_norm_after_rope(q, k, v, q_weight, k_weight, eps=1e-6):
    """RoPE first, then the norms (the gain then multiplies rotated features)."""
    return _attend(_rms(apply_rope(q), q_weight, eps), _rms(apply_rope(k), k_weight, eps), v)


def qk_norm_whole_projection(q, k, v, q_weight, k_weight, eps=1e-6):
    """OLMo 2's placement: the root mean square over every head of a token together."""
    q = apply_rope(_rms(q, q_weight, eps, dims=(1, 3)))
    k = apply_rope(_rms(k, k_weight, eps, dims=(1, 3)))
    return _attend(q, k, v)


def qk_norm_one_gain(q, k, v, q_weight, k_weight, eps=1e-6):
    """One norm for both: the keys are normalised with q_weight."""
    return _attend(apply_rope(_rms(q, q_weight, eps)), apply_rope(_rms(k, q_weight, eps)), v)


def qk_norm_values_too(q, k, v, q_weight, k_weight, eps=1e-6):
    """The values are normalised as well (with k's gain)."""
    q, k = apply_rope(_rms(q, q_weight, eps)), apply_rope(_rms(k, k_weight, eps))
    return _attend(q, k, _rms(v, k_weight, eps))


def qk_norm_no_scale(q, k, v, q_weight, k_weight, eps=1e-6):
    """The 1/sqrt(Dh) scale dropped, "since the norm bounds the scores"."""
    q, k = apply_rope(_rms(q, q_weight, eps)), apply_rope(_rms(k, k_weight, eps))
    return _attend(q, k, v, scale=False)


def qk_norm_queries_only(q, k, v, q_weight, k_weight, eps=1e-6):
    """Only the queries are normalised."""
    return _attend(apply_rope(_rms(q, q_weight, eps)), apply_rope(k), v)


def qk_norm_eps_ignored(q, k, v, q_weight, k_weight, eps=1e-6):
    """eps fixed at 1e-6 whatever is given (the eps=0.1 case shows it)."""
    return qk_norm_reference(q, k, v, q_weight, k_weight, 1e-6)


def qk_norm_eps_outside(q, k, v, q_weight, k_weight, eps=1e-6):
    """eps added after the square root: x / (sqrt(mean(x²)) + eps)."""

    def norm(x, w):
        return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * w

    return _attend(apply_rope(norm(q, q_weight)), apply_rope(norm(k, k_weight)), v)


def softcap_after_mask(q, k, v, cap):
    """The mask first (-inf), then the cap: masked keys come back with score -cap."""
    T = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return (cap * torch.tanh(scores / cap)).softmax(-1) @ v


def softcap_on_probabilities(q, k, v, cap):
    """The cap applied to the softmax's output."""
    T = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return cap * torch.tanh(scores.softmax(-1) / cap) @ v


def softcap_before_scale(q, k, v, cap):
    """cap * tanh(q k^T / cap), then the 1/sqrt(Dh) scale."""
    T = q.shape[-2]
    scores = cap * torch.tanh(q @ k.transpose(-2, -1) / cap) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


def softcap_clamp(q, k, v, cap):
    """Hard clipping, scores.clamp(-cap, cap), for the smooth cap."""
    T = q.shape[-2]
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).clamp(-cap, cap)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


def softcap_tanh_only(q, k, v, cap):
    """tanh(s / cap), the factor cap forgotten."""
    T = q.shape[-2]
    scores = torch.tanh(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) / cap)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


def softcap_ignored(q, k, v, cap):
    """Plain causal attention: the cap is never applied."""
    return _attend(q, k, v)


def qk_norm_missing(q, k, v, q_weight, k_weight, eps=1e-6):
    """No norm at all: RoPE and attention only."""
    return _attend(apply_rope(q), apply_rope(k), v)


def qk_norm_keys_only(q, k, v, q_weight, k_weight, eps=1e-6):
    """Only the keys are normalised."""
    return _attend(apply_rope(q), apply_rope(_rms(k, k_weight, eps)), v)


def qk_norm_over_tokens(q, k, v, q_weight, k_weight, eps=1e-6):
    """The mean square over the positions (dim=-2) instead of the features."""
    return _attend(
        apply_rope(_rms(q, q_weight, eps, dims=(-2,))),
        apply_rope(_rms(k, k_weight, eps, dims=(-2,))),
        v,
    )


def qk_norm_layer_norm(q, k, v, q_weight, k_weight, eps=1e-6):
    """LayerNorm's centring: the mean subtracted before the root mean square."""

    def centred(x, w):
        return _rms(x - x.mean(-1, keepdim=True), w, eps)

    return _attend(apply_rope(centred(q, q_weight)), apply_rope(centred(k, k_weight)), v)


def qk_norm_no_rope(q, k, v, q_weight, k_weight, eps=1e-6):
    """The norms, but RoPE forgotten."""
    return _attend(_rms(q, q_weight, eps), _rms(k, k_weight, eps), v)


def qk_norm_rope_on_values(q, k, v, q_weight, k_weight, eps=1e-6):
    """RoPE applied to the values too."""
    q, k = apply_rope(_rms(q, q_weight, eps)), apply_rope(_rms(k, k_weight, eps))
    return _attend(q, k, apply_rope(v))


def _capped(q, k, v, cap, transform):
    T = q.shape[-2]
    scores = transform(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


def softcap_tanh_not_divided(q, k, v, cap):
    """cap * tanh(s): the division by the cap inside the tanh forgotten."""
    return _capped(q, k, v, cap, lambda s: cap * torch.tanh(s))


def softcap_output(q, k, v, cap):
    """The cap applied to the attention's output instead of its scores."""
    return cap * torch.tanh(_attend(q, k, v) / cap)


def _attend_masked(q, k, v, hide, scale=None, cap=None):
    """Causal attention whose hidden keys are ``hide(ones (T, T))``."""
    T, Dh = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1) * (Dh**-0.5 if scale is None else scale)
    if cap is not None:
        scores = cap * torch.tanh(scores / cap)
    future = hide(torch.ones(T, T, dtype=torch.bool))
    return scores.masked_fill(future, float("-inf")).softmax(-1) @ v


def _normed(q, k, q_weight, k_weight, eps):
    return apply_rope(_rms(q, q_weight, eps)), apply_rope(_rms(k, k_weight, eps))


def qk_norm_mask_hides_diagonal(q, k, v, q_weight, k_weight, eps=1e-6):
    """triu(0): the diagonal hidden too (the first query sees nothing: NaN)."""
    return _attend_masked(*_normed(q, k, q_weight, k_weight, eps), v, lambda o: o.triu(0))


def qk_norm_mask_sees_next(q, k, v, q_weight, k_weight, eps=1e-6):
    """triu(2): one future key visible."""
    return _attend_masked(*_normed(q, k, q_weight, k_weight, eps), v, lambda o: o.triu(2))


def qk_norm_mask_transposed(q, k, v, q_weight, k_weight, eps=1e-6):
    """tril(-1): the past hidden, the future visible."""
    return _attend_masked(*_normed(q, k, q_weight, k_weight, eps), v, lambda o: o.tril(-1))


def qk_norm_scale_one_over_dh(q, k, v, q_weight, k_weight, eps=1e-6):
    """The scores divided by Dh, not sqrt(Dh)."""
    qn, kn = _normed(q, k, q_weight, k_weight, eps)
    return _attend_masked(qn, kn, v, lambda o: o.triu(1), scale=1 / q.shape[-1])


def qk_norm_float32_round_trip(q, k, v, q_weight, k_weight, eps=1e-6):
    """Not a wrong formula but against the statement: Hugging Face's RMSNorm round trip,
    the norm computed in float32 and cast back (float64 input: float32's precision)."""

    def rms(x, w):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    return _attend(apply_rope(rms(q, q_weight)), apply_rope(rms(k, k_weight)), v)


def softcap_mask_hides_diagonal(q, k, v, cap):
    """triu(0): the diagonal hidden too."""
    return _attend_masked(q, k, v, lambda o: o.triu(0), cap=cap)


def softcap_mask_sees_next(q, k, v, cap):
    """triu(2): one future key visible."""
    return _attend_masked(q, k, v, lambda o: o.triu(2), cap=cap)


def softcap_mask_transposed(q, k, v, cap):
    """tril(-1): the past hidden, the future visible."""
    return _attend_masked(q, k, v, lambda o: o.tril(-1), cap=cap)


CATALOGUE = [
    ("qk_norm_attention", "norm after RoPE", qk_norm_after_rope, "qk-norm-after-rope"),
    (
        "qk_norm_attention",
        "norm over the whole projection",
        qk_norm_whole_projection,
        "qk-norm-over-whole-projection",
    ),
    ("qk_norm_attention", "one gain for q and k", qk_norm_one_gain, "qk-norm-one-norm-for-q-and-k"),
    ("qk_norm_attention", "values normalised", qk_norm_values_too, "qk-norm-on-values"),
    ("qk_norm_attention", "scale dropped", qk_norm_no_scale, "qk-norm-scale-dropped"),
    ("qk_norm_attention", "queries only", qk_norm_queries_only, "qk-norm-queries-only"),
    ("qk_norm_attention", "eps ignored", qk_norm_eps_ignored, "qk-norm-eps-ignored"),
    ("qk_norm_attention", "eps outside the root", qk_norm_eps_outside, "qk-norm-eps-outside-root"),
    ("softcap_attention", "cap after the mask", softcap_after_mask, "softcap-after-mask"),
    (
        "softcap_attention",
        "cap on the probabilities",
        softcap_on_probabilities,
        "softcap-on-probabilities",
    ),
    ("softcap_attention", "cap before the scale", softcap_before_scale, "softcap-before-scale"),
    ("softcap_attention", "clamp", softcap_clamp, "softcap-clamped"),
    ("softcap_attention", "tanh without the cap", softcap_tanh_only, "softcap-factor-missing"),
    ("softcap_attention", "cap ignored", softcap_ignored, "softcap-ignored"),
    ("softcap_attention", "cap * tanh(s)", softcap_tanh_not_divided, "softcap-divide-missing"),
    ("softcap_attention", "cap on the output", softcap_output, "softcap-on-output"),
    ("qk_norm_attention", "no norm", qk_norm_missing, "qk-norm-missing"),
    ("qk_norm_attention", "keys only", qk_norm_keys_only, "qk-norm-keys-only"),
    ("qk_norm_attention", "norm over the positions", qk_norm_over_tokens, "qk-norm-over-tokens"),
    ("qk_norm_attention", "LayerNorm", qk_norm_layer_norm, "qk-norm-mean-subtracted"),
    ("qk_norm_attention", "no RoPE", qk_norm_no_rope, "rope-missing"),
    ("qk_norm_attention", "RoPE on the values", qk_norm_rope_on_values, "rope-on-values"),
    (
        "qk_norm_attention",
        "mask hides the diagonal",
        qk_norm_mask_hides_diagonal,
        "causal-mask-hides-diagonal",
    ),
    (
        "qk_norm_attention",
        "mask sees the next key",
        qk_norm_mask_sees_next,
        "causal-mask-sees-next",
    ),
    ("qk_norm_attention", "mask transposed", qk_norm_mask_transposed, "causal-mask-inverted"),
    ("qk_norm_attention", "scale 1/Dh", qk_norm_scale_one_over_dh, "qk-norm-scale-one-over-dh"),
    (
        "softcap_attention",
        "mask hides the diagonal",
        softcap_mask_hides_diagonal,
        "causal-mask-hides-diagonal",
    ),
    (
        "softcap_attention",
        "mask sees the next key",
        softcap_mask_sees_next,
        "causal-mask-sees-next",
    ),
    ("softcap_attention", "mask transposed", softcap_mask_transposed, "causal-mask-inverted"),
]
