"""Checkers for exercise 20 (keeping attention logits in range): QK-norm placed as Qwen3
places it, and Gemma 2's soft-capping of the scores.

Both targets are causal attention over heads already split, ``(B, H, T, Dh)``, with one
extra step; the checkers compare with the package's own pieces (``RMSNorm``'s formula,
``apply_rope``, ``softcap``) and name the placements students get wrong: the norm after
RoPE, over the whole projection (OLMo 2's), one gain for both q and k; the cap after the
mask, on the probabilities, before the scale.
"""

from __future__ import annotations

import math

import torch

from ._compare import expect_close, expect_grad
from ._data import draw_until, randn
from ._mistakes import says
from ._modules import leaves
from ._runner import TRIVIAL, Case, CaseFailed, call_student, checker

_DTYPE_HINT = (
    "keep the inputs' dtype: do not cast with `.float()`, and create new tensors (the mask) "
    "with `device=q.device`"
)


def _rms(
    x: torch.Tensor, weight: torch.Tensor, eps: float, dims=(-1,), centre=False, outside=False
):
    if centre:
        x = x - x.mean(dim=dims, keepdim=True)
    if outside:  # a mistake: eps added after the square root
        return x / (x.pow(2).mean(dim=dims, keepdim=True).sqrt() + eps) * weight
    return x * torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + eps) * weight


_MASKS = {
    # which keys are hidden from query t: the right one (j > t), and the usual slips
    "causal": lambda ones: ones.triu(1),
    "hides diagonal": lambda ones: ones.triu(0),  # j >= t: a token cannot see itself
    "sees next": lambda ones: ones.triu(2),  # j > t + 1: one future key visible
    "transposed": lambda ones: ones.tril(-1),  # j < t: the past hidden, the future seen
}


def _causal_attention(
    q, k, v, *, scaled=True, causal=True, cap=None, cap_where="scores", mask="causal", scale=None
):
    """Causal attention over (..., T, Dh), optionally soft-capped at ``cap``;
    ``cap_where`` places the cap (a mistake, or the right place, "scores"); ``mask`` names
    the hidden keys (`_MASKS`); ``scale`` replaces 1/sqrt(Dh) (a mistake)."""
    T, Dh = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1)  # (..., T, T)
    if cap is not None and cap_where == "before scale":
        scores = cap * torch.tanh(scores / cap)
    if scale is not None:
        scores = scores * scale
    elif scaled:
        scores = scores / math.sqrt(Dh)
    if cap is not None:
        if cap_where == "scores":
            scores = cap * torch.tanh(scores / cap)
        elif cap_where == "factor missing":
            scores = torch.tanh(scores / cap)
        elif cap_where == "divide missing":
            scores = cap * torch.tanh(scores)
        elif cap_where == "clamp":
            scores = scores.clamp(-cap, cap)
    future = _MASKS[mask](torch.ones(T, T, dtype=torch.bool, device=q.device))
    if causal:
        scores = scores.masked_fill(future, float("-inf"))
    if cap is not None and cap_where == "after mask":
        scores = cap * torch.tanh(scores / cap)
    weights = scores.softmax(dim=-1)
    if cap is not None and cap_where == "probabilities":
        weights = cap * torch.tanh(weights / cap)
    out = weights @ v
    if cap is not None and cap_where == "output":
        out = cap * torch.tanh(out / cap)
    return out


# ---------------------------------------------------------------- QK-norm


def qk_norm_reference(q, k, v, q_weight, k_weight, eps=1e-6):
    """Qwen3's attention step after the projections: RMSNorm over each head's Dh with the
    gains ``q_weight``, ``k_weight`` ``(Dh,)``, then RoPE at 0 .. T-1, then causal
    attention scaled by Dh^-1/2. q, k, v ``(B, H, T, Dh)`` -> ``(B, H, T, Dh)``."""
    from attention_course.relative_positions import apply_rope

    q = apply_rope(_rms(q, q_weight, eps))
    k = apply_rope(_rms(k, k_weight, eps))
    return _causal_attention(q, k, v)


def _qk_norm_variant(q, k, v, qw, kw, eps, **mistake):
    """The reference with one mistake switched on."""
    from attention_course.relative_positions import apply_rope

    def norm(x, w):
        if mistake.get("norm") == "none":
            return x
        if mistake.get("norm") == "whole":  # over (H, Dh): the whole projection, per token
            return _rms(x, w, eps, dims=(-3, -1))
        if mistake.get("norm") == "tokens":
            return _rms(x, w, eps, dims=(-2,))
        norm_eps = mistake.get("norm_eps", eps)
        return _rms(
            x,
            w,
            norm_eps,
            centre=mistake.get("norm") == "centre",
            outside=mistake.get("norm") == "eps outside",
        )

    rope = (lambda x: x) if mistake.get("rope") == "none" else apply_rope
    gain_q = kw if mistake.get("gains") == "k" else qw
    gain_k = qw if mistake.get("gains") == "q" else kw
    only = mistake.get("only")
    if mistake.get("after_rope"):
        q2, k2 = norm(rope(q), gain_q), norm(rope(k), gain_k)
    else:
        q2 = rope(norm(q, gain_q)) if only != "k" else rope(q)
        k2 = rope(norm(k, gain_k)) if only != "q" else rope(k)
    if mistake.get("values") == "norm":
        v = norm(v, kw)
    elif mistake.get("values") == "rope":
        v = apply_rope(v)
    Dh = q.shape[-1]
    return _causal_attention(
        q2,
        k2,
        v,
        scaled=not mistake.get("unscaled"),
        causal=not mistake.get("no_causal"),
        mask=mistake.get("mask", "causal"),
        scale=1 / Dh if mistake.get("scale") == "1/Dh" else None,
    )


def _qk_norm_mistakes(q, k, v, qw, kw, eps):
    def variant(**mistake):
        return lambda: _qk_norm_variant(q, k, v, qw, kw, eps, **mistake)

    ignored = [
        (says("qk-norm-eps-ignored"), variant(norm_eps=fixed))
        for fixed in (1e-6, 1e-5, 0.0)
        if fixed != eps
    ]
    return ignored + [
        (says("qk-norm-after-rope"), variant(after_rope=True)),
        (says("qk-norm-over-whole-projection"), variant(norm="whole")),
        (says("qk-norm-one-norm-for-q-and-k"), variant(gains="q")),
        (says("qk-norm-one-norm-for-q-and-k"), variant(gains="k")),
        (says("qk-norm-missing"), variant(norm="none")),
        (says("qk-norm-queries-only"), variant(only="q")),
        (says("qk-norm-keys-only"), variant(only="k")),
        (says("qk-norm-on-values"), variant(values="norm")),
        (says("qk-norm-over-tokens"), variant(norm="tokens")),
        (says("qk-norm-mean-subtracted"), variant(norm="centre")),
        (says("qk-norm-eps-outside-root"), variant(norm="eps outside")),
        (says("qk-norm-scale-dropped"), variant(unscaled=True)),
        (says("qk-norm-scale-one-over-dh"), variant(scale="1/Dh")),
        *_mask_mistakes(variant),
        (says("rope-missing"), variant(rope="none")),
        (says("rope-on-values"), variant(values="rope")),
        (says("no-causal-mask"), variant(no_causal=True)),
    ]


def _mask_mistakes(variant):
    """The causal mask off by one (either way) or transposed, named in both tasks."""
    return [
        (says("causal-mask-hides-diagonal"), variant(mask="hides diagonal")),
        (says("causal-mask-sees-next"), variant(mask="sees next")),
        (says("causal-mask-inverted"), variant(mask="transposed")),
    ]


def keep_float64_hint(expected: torch.Tensor):
    """Exercises 20 and 21 are float64-strict, as the course's checkers are
    (`_compare.TOLERANCES`): a float64 result right only to float32's precision leads with
    the statements' rule, "keep float64: no float32 round trip"."""

    def hint(got: torch.Tensor) -> str | None:
        if expected.dtype != torch.float64 or not got.is_floating_point():
            return None
        got = got.to(torch.float64)
        if not bool(torch.isfinite(got).all()) or not bool(torch.isfinite(expected).all()):
            return None
        scale = 1.0 + (float(expected.abs().max()) if expected.numel() else 0.0)
        error = float((got - expected).abs().max()) / scale
        if error > 1e-5:
            return None
        return (
            "keep float64: no float32 round trip. Your values differ from the reference by a "
            f"relative {error:.2g} only, float32's precision, where float64 arithmetic agrees "
            "to about 1e-15: something ran in float32 and came back (`.float()` ... "
            "`.to(x.dtype)` as Hugging Face's RMSNorm does, a softmax in float32 as "
            "Mixtral's router does, `one_hot(...).float()`, or a new tensor without "
            "`dtype=x.dtype`); the statement asks for float64 throughout. If nothing does, "
            "look for a small constant in the wrong place (an epsilon outside the square "
            "root, or one the formula does not have)"
        )

    return hint


def _qk_inputs(shape, seed, dtype):
    """q, k, v ``shape`` and two gains ``(Dh,)`` far from ones (with gains of ones the
    norm commutes with RoPE: the placement would not show)."""
    B, H, T, Dh = shape
    # per-head, per-token sizes that differ: a norm over the wrong axes changes them
    q = randn(*shape, seed=seed) * (0.5 + randn(B, H, T, 1, seed=seed + 1).abs())
    k = randn(*shape, seed=seed + 2) * (0.5 + randn(B, H, T, 1, seed=seed + 3).abs())
    v = randn(*shape, seed=seed + 4)

    def gain(s):
        return draw_until(
            lambda name: 1.0 + 0.5 * randn(Dh, seed=name),
            lambda w: float(w.max() - w.min()) > 0.5,  # far from uniform
            s,
        )

    return [t.to(dtype) for t in (q, k, v, gain(seed + 5), gain(seed + 6))]


def _qk_norm_case(candidate, shape, seed, dtype=torch.float64, grad=False, eps=None):
    def run():
        q, k, v, qw, kw = _qk_inputs(shape, seed, dtype)
        mine, theirs = leaves(q, k, v, grad=grad)
        use_eps = 1e-6 if eps is None else eps
        want = qk_norm_reference(*theirs, qw, kw, use_eps)
        given_eps = "" if eps is None else f", eps={eps:g}"
        call = f"qk_norm_attention(q, k, v, q_weight, k_weight{given_eps}), q {tuple(shape)}"
        extra = {} if eps is None else {"eps": eps}
        got = call_student(
            candidate,
            *mine,
            qw,
            kw,
            what=call,
            arg_names=("q", "k", "v", "q_weight", "k_weight"),
            **extra,
        )
        with torch.no_grad():
            mistakes = _qk_norm_mistakes(q, k, v, qw, kw, use_eps)
        _judge(got, want, call, mistakes, grad, seed, mine, theirs)

    return run


def _judge(got, want, call, mistakes, grad, seed, mine, theirs):
    """The output against the reference (naming a known mistake), then, with ``grad``, the
    gradients reaching ``q``, ``k`` and ``v`` (``mine``, ``theirs``: their leaves)."""
    expect_close(
        got,
        want.detach(),
        f"the output of {call}",
        mistakes=mistakes,
        hints=[keep_float64_hint(want.detach())],
        dtype_hint=_DTYPE_HINT,
    )
    if grad:
        _backward(got, want, seed + 9)
        for name, a, b in zip(("`q`", "`k`", "`v`"), mine, theirs, strict=True):
            expect_grad(a.grad, b.grad, name)


def _backward(got, want, seed):
    upstream = randn(*want.shape, seed=seed).to(want.dtype)
    want.backward(upstream)
    if not got.requires_grad:
        raise CaseFailed(
            "the output does not require grad, so no gradient can flow back to q, k and v: "
            "no `torch.no_grad()`, `.detach()`, `.data` or `.numpy()`"
        )
    call_student(got.backward, upstream.to(got.dtype), what="backpropagating through your output")


@checker("qk_norm_attention")
def check_qk_norm_attention(candidate) -> list[Case]:
    """Check ``qk_norm_attention(q, k, v, q_weight, k_weight, eps=1e-6)``: q and k
    ``(B, H, T, Dh)`` each normalised per head over Dh by RMSNorm with its own gain, then
    rotated by ``apply_rope`` at 0 .. T-1, then causal attention scaled by Dh^-1/2."""
    return [
        # first: a large eps shows where it goes, so an eps outside the square root is named
        # before the default-eps cases (where it is as small as float32 rounding)
        Case(
            "eps=0.1 given (a large eps shows where it goes), B=2, H=2, T=4, Dh=8",
            _qk_norm_case(candidate, (2, 2, 4, 8), 2031, eps=0.1),
            covers=frozenset({"eps"}),
        ),
        Case(
            "B=2, H=3, T=5, Dh=8: norm per head, then RoPE, then causal attention",
            _qk_norm_case(candidate, (2, 3, 5, 8), 2001),
            covers=frozenset({"H>1", "B>1", "dtype=float64"}),
        ),
        Case(
            "B=1, H=4, T=6, Dh=4: heads of very different sizes",
            _qk_norm_case(candidate, (1, 4, 6, 4), 2011),
            covers=frozenset({"B=1", "H>1"}),
        ),
        Case(
            "H=1 (the per-head and whole-projection norms agree), T=7, Dh=6",
            _qk_norm_case(candidate, (2, 1, 7, 6), 2021),
            covers=frozenset({"H=1", "odd T"}),
        ),
        Case(
            "float32 inputs give float32 results",
            _qk_norm_case(candidate, (2, 2, 5, 8), 2041, dtype=torch.float32),
            covers=frozenset({"dtype=float32"}),
        ),
        Case(
            "T=1: one position (the output is v)",
            _qk_norm_case(candidate, (2, 2, 1, 4), 2051),
            weight=TRIVIAL,
            support=True,
            covers=frozenset({"T=1"}),
        ),
        Case(
            "gradients flow to q, k and v",
            _qk_norm_case(candidate, (2, 2, 5, 4), 2061, grad=True),
            covers=frozenset({"grad"}),
        ),
    ]


# ---------------------------------------------------------------- soft-capping


def softcap_reference(q, k, v, cap):
    """Gemma 2's capped causal attention: scores ``q @ k^T / sqrt(Dh)``, then
    ``cap * tanh(scores / cap)``, then the causal mask, softmax over the keys, ``@ v``.
    q, k, v ``(..., T, Dh)`` -> ``(..., T, Dh)``."""
    return _causal_attention(q, k, v, cap=cap)


def _softcap_mistakes(q, k, v, cap):
    def variant(**options):
        return lambda: _causal_attention(q, k, v, **options)

    return [
        (says("softcap-after-mask"), variant(cap=cap, cap_where="after mask")),
        (says("softcap-on-probabilities"), variant(cap=cap, cap_where="probabilities")),
        (says("softcap-before-scale"), variant(cap=cap, cap_where="before scale")),
        (says("softcap-factor-missing"), variant(cap=cap, cap_where="factor missing")),
        (says("softcap-divide-missing"), variant(cap=cap, cap_where="divide missing")),
        (says("softcap-clamped"), variant(cap=cap, cap_where="clamp")),
        (says("softcap-ignored"), variant()),
        (says("softcap-on-output"), variant(cap=cap, cap_where="output")),
        (says("no-causal-mask"), variant(cap=cap, causal=False)),
        *_mask_mistakes(lambda **mask: variant(cap=cap, **mask)),
    ]


def _softcap_case(
    candidate, shape, seed, cap, size, dtype=torch.float64, grad=False, first_key_away=False
):
    """Inputs of standard deviation ``size``: scores of about ``size**2`` (so the cap
    bites where ``size**2`` is comparable to ``cap`` or larger).

    ``first_key_away``: key 0 is minus query 0, so query 0's one visible score is far below
    ``-cap`` whatever the draw; capped, it sits next to ``-cap``, where a cap applied after
    the mask also puts the hidden keys, so that mistake shows under every run seed."""

    def run():
        q = size * randn(*shape, seed=seed)
        k = size * randn(*shape, seed=seed + 1)
        if first_key_away:
            k[..., 0, :] = -q[..., 0, :]
        v = randn(*shape, seed=seed + 2)
        q, k, v = (t.to(dtype) for t in (q, k, v))
        mine, theirs = leaves(q, k, v, grad=grad)
        want = softcap_reference(*theirs, cap)
        call = f"softcap_attention(q, k, v, cap={cap:g}), each {tuple(shape)}"
        got = call_student(candidate, *mine, cap, what=call, arg_names=("q", "k", "v"))
        with torch.no_grad():
            mistakes = _softcap_mistakes(q, k, v, cap)
        _judge(got, want, call, mistakes, grad, seed, mine, theirs)

    return run


@checker("softcap_attention")
def check_softcap_attention(candidate) -> list[Case]:
    """Check ``softcap_attention(q, k, v, cap)``: causal attention over ``(..., T, Dh)``
    whose scores, scaled by Dh^-1/2, are soft-capped, ``cap * tanh(s / cap)``, before the
    mask and the softmax (Gemma 2)."""
    return [
        Case(
            "B=2, H=3, T=6, Dh=8, cap=5 on scores of about 6",
            _softcap_case(candidate, (2, 3, 6, 8), 2101, cap=5.0, size=2.5),
            covers=frozenset({"H>1", "B>1", "dtype=float64"}),
        ),
        Case(
            "cap=50 (Gemma 2's) on scores of about 100",
            _softcap_case(candidate, (1, 2, 5, 4), 2111, cap=50.0, size=10.0, first_key_away=True),
            covers=frozenset({"B=1", "large scores"}),
        ),
        Case(
            "cap=1 on small scores, no head axis (T, Dh) = (7, 6)",
            _softcap_case(candidate, (7, 6), 2121, cap=1.0, size=1.0),
            covers=frozenset({"no head axis", "odd T"}),
        ),
        Case(
            "H=1, cap=3",
            _softcap_case(candidate, (2, 1, 5, 4), 2131, cap=3.0, size=2.0),
            covers=frozenset({"H=1"}),
        ),
        Case(
            "float32 inputs give float32 results",
            _softcap_case(candidate, (2, 2, 5, 8), 2141, cap=5.0, size=2.5, dtype=torch.float32),
            covers=frozenset({"dtype=float32"}),
        ),
        Case(
            "T=1: one position (the output is v)",
            _softcap_case(candidate, (2, 2, 1, 4), 2151, cap=5.0, size=2.5),
            weight=TRIVIAL,
            support=True,
            covers=frozenset({"T=1"}),
        ),
        Case(
            "gradients flow to q, k and v",
            _softcap_case(candidate, (2, 2, 5, 4), 2161, cap=4.0, size=2.0, grad=True),
            covers=frozenset({"grad"}),
        ),
    ]
