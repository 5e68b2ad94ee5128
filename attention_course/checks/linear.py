"""Checkers for exercise 22 (attention with a fixed-size state): causal linear attention
computed with a running state, and the gated delta rule token by token.

Both compare with the package's references (`attention_course.linear`, which the grader's
sandbox does not have) and name the slips chapter 22 warns about by computing each one
here, in float64, on the same inputs: for linear attention the normaliser forgotten, the
state updated after the read, sums that are not causal, the feature map wrong; for the
delta rule the decay after the update, beta on the wrong term, the read-back against the
undecayed state, the scale forgotten, the output read before the update, the initial state
ignored, the state returned transposed.

The drawn inputs keep every known mistake visible under every run seed: the gates ``g``
and strengths ``beta`` are drawn away from 0 and 1, and the linear-attention inputs are
redrawn until the normaliser of ``phi = elu`` (no +1, a mistake that can divide by
numbers near 0) stays away from 0, so that mistake is recognised wherever it is made.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attention_course import linear as ref_linear

from ._compare import expect_close, expect_grad, expect_tuple, fmt_shape
from ._data import draw_until, generator, randn
from ._mistakes import says
from ._modules import leaves
from ._runner import TRIVIAL, Case, CaseFailed, call_student, checker, expect_value_error
from .logit_range import keep_float64_hint

_DTYPE_HINT = (
    "keep the inputs' dtype: do not cast with `.float()`, and create new tensors (the "
    "state, the normaliser) with `dtype=q.dtype, device=q.device`"
)
_INPLACE_HINT = (
    "the state was changed in place (`S += ...`, `S[...] = ...`) after a product had used "
    "it: autograd needs every earlier state; write `S = S + ...`"
)


def _error_hint(text: str) -> str | None:
    return _INPLACE_HINT if "inplace operation" in text else None


def _named_apart(mistakes, expected: torch.Tensor):
    """The known mistakes, computed once, with those that give the same values on this
    case merged into one description that names them all (as `interpret._unambiguous`
    does): at T=1 from a zero state, for instance, beta ignored and beta on the read-back
    only both write k v^T, and naming one of them would be a guess. Mistakes that give the
    right values here are left out."""
    computed = []
    for why, compute in mistakes:
        try:
            value = compute()
        except Exception:  # noqa: BLE001 - a mistake that cannot be computed does not match
            continue
        if not isinstance(value, torch.Tensor):
            continue
        value = value.detach().double()
        if value.shape == expected.shape and torch.allclose(
            value, expected.detach().double(), atol=1e-6, rtol=0
        ):
            continue
        computed.append((why, value))
    result = []
    for why, value in computed:
        twins = []
        for other, v in computed:
            if (
                other != why
                and other not in twins
                and v.shape == value.shape
                and torch.allclose(v, value, atol=1e-6, rtol=0, equal_nan=True)
            ):
                twins.append(other)
        if twins:
            clauses = "; or ".join(text.split(": ")[0] for text in [why, *twins])
            why = (
                "one of several mistakes that all give your values on this case (a later "
                f"case tells them apart): {clauses}"
            )
        result.append((why, lambda v=value: v))
    return result


# ---------------------------------------------------------------- linear attention

_PHI = {
    "elu+1": lambda x: F.elu(x) + 1.0,
    "elu": F.elu,
    "none": lambda x: x,
    "relu": F.relu,
    "relu+1": lambda x: F.relu(x) + 1.0,
    "exp": torch.exp,
    "softplus": F.softplus,
    "elu+2": lambda x: F.elu(x) + 2.0,
}
# feature maps other than elu + 1 that students reach for, named as they are written
_OTHER_MAPS = {
    "relu": "relu(x)",
    "relu+1": "relu(x) + 1",
    "exp": "exp(x)",
    "softplus": "softplus(x)",
    "elu+2": "elu(x) + 2",
}


def _linear_variant(
    q,
    k,
    v,
    causal=True,
    *,
    phi="elu+1",
    phi_k=None,
    normaliser=True,
    keys="causal",
    denominator=None,
    scaled=False,
    scaled_both=False,
    scaled_output=False,
    phi_on_values=False,
    first=None,
):
    """Linear attention in its explicit (..., T, S) form with one mistake switched on (none:
    the right output). ``keys`` picks the keys each position sums over ("causal": j <= i,
    "strict": j < i, "all"); ``denominator`` the normaliser's (default: the same);
    ``first`` replaces the 0/0 of the first row with that number; ``phi_k`` is the keys'
    feature map when it differs from the queries' (``phi``)."""
    f = _PHI[phi]
    if scaled or scaled_both:
        q = q / math.sqrt(q.shape[-1])
    if scaled_both:
        k = k / math.sqrt(k.shape[-1])
    fq, fk = f(q), _PHI[phi_k or phi](k)
    fv = f(v) if phi_on_values else v
    T, S = q.shape[-2], k.shape[-2]
    ones = torch.ones(T, S, dtype=q.dtype, device=q.device)
    masks = {"causal": ones.tril(), "strict": ones.tril(-1), "all": ones}
    if not causal and keys == "causal":
        keys = "all"  # the right non-causal form; "causal" is asked for by name below
    weights = fq @ fk.transpose(-2, -1)  # (..., T, S)
    out = (weights * masks[keys]) @ fv
    if normaliser:
        den = (weights * masks[denominator or keys]).sum(dim=-1, keepdim=True)
        out = out / den
    if first is not None:
        out = out.nan_to_num(nan=first)
    if scaled_output:
        out = out / math.sqrt(q.shape[-1])
    return out


def _linear_mistakes(q, k, v, causal):
    def variant(**mistake):
        return lambda: _linear_variant(q, k, v, causal, **mistake)

    found = [
        (says("linear-normaliser-missing"), variant(normaliser=False)),
        (says("linear-feature-map-elu-without-one"), variant(phi="elu")),
        (says("linear-feature-map-missing"), variant(phi="none")),
        (says("linear-feature-map-on-values"), variant(phi_on_values=True)),
        (says("linear-scaled"), variant(scaled=True)),
        (says("linear-scaled-inside-phi"), variant(scaled_both=True)),
        (says("linear-scaled-output"), variant(scaled_output=True)),
        (says("linear-feature-map-queries-only"), variant(phi_k="none")),
        (says("linear-feature-map-keys-only"), variant(phi="none", phi_k="elu+1")),
        (
            says("linear-feature-map-other", name="relu(x) + 1 on the keys"),
            variant(phi_k="relu+1"),
        ),
    ] + [
        (says("linear-feature-map-other", name=name), variant(phi=key))
        for key, name in _OTHER_MAPS.items()
    ]
    if causal:
        return found + [
            (says("linear-state-updated-after-read"), variant(keys="strict")),
            (says("linear-state-updated-after-read"), variant(keys="strict", first=0.0)),
            (says("linear-not-causal"), variant(keys="all")),
            (says("linear-normaliser-not-causal"), variant(denominator="all")),
        ]
    return found + [
        (says("linear-causal-flag-ignored"), lambda: _linear_variant(q, k, v, True)),
    ]


def _non_causal_error_hint(text: str) -> str:
    return _error_hint(text) or (
        "with causal=False the number of keys S may differ from the number of queries T "
        "(cross-attention): every query sums over all S keys; only causal=True needs S = T"
    )


def _right_when_told(candidate, q, k, v, want) -> bool:
    """Whether ``candidate`` gives the right causal output when causal=True is passed (the
    default case failed: then the default is what is wrong)."""
    try:
        with torch.no_grad():
            told = candidate(
                q.detach().clone(), k.detach().clone(), v.detach().clone(), causal=True
            )
    except Exception:  # noqa: BLE001 - a candidate that fails here says nothing
        return False
    return (
        isinstance(told, torch.Tensor)
        and told.shape == want.shape
        and torch.allclose(told.detach().double(), want.detach().double(), atol=1e-8, rtol=1e-6)
    )


def _away_from_zero(q, k, causal) -> bool:
    """Whether the normaliser of phi = elu (a mistake) keeps |phi(q_i) . z_i| >= 0.05 at
    every position past the first: near 0, that mistake's output would depend on rounding
    and could not be recognised. With one position, also that of phi = relu (a mistake
    that gives 0/0 where q and k share no positive coordinate): at T=1 every phi gives the
    output v, and relu's must not turn to NaN under some run seeds only."""
    maps = (F.elu, F.relu) if q.shape[-2] == 1 else (F.elu,)
    for phi in maps:
        weights = phi(q) @ phi(k).transpose(-2, -1)
        if causal:
            weights = weights.tril()
        den = weights.sum(dim=-1)
        if not bool((den.abs() >= 0.05).all()):
            return False
    return True


def _linear_case(
    candidate,
    lead,
    T,
    S,
    Dk,
    Dv,
    seed,
    *,
    causal=True,
    dtype=torch.float64,
    grad=False,
    pass_causal=True,
):
    """Inputs q ``(*lead, T, Dk)``, k ``(*lead, S, Dk)``, v ``(*lead, S, Dv)``."""

    def run():
        def draw(name):
            return (
                randn(*lead, T, Dk, seed=name),
                randn(*lead, S, Dk, seed=name + 1),
                randn(*lead, S, Dv, seed=name + 2),
            )

        q, k, v = draw_until(draw, lambda t: _away_from_zero(t[0], t[1], causal), seed)
        q, k, v = (t.to(dtype) for t in (q, k, v))
        mine, theirs = leaves(q, k, v, grad=grad)
        want = ref_linear.linear_attention(*theirs, causal=causal)
        shown = f"causal={causal}" if pass_causal else "causal left at its default"
        call = (
            f"linear_attention(q {fmt_shape(q.shape)}, k {fmt_shape(k.shape)}, "
            f"v {fmt_shape(v.shape)}, {shown})"
        )
        extra = {"causal": causal} if pass_causal else {}
        got = call_student(
            candidate,
            *mine,
            what=call,
            arg_names=("query", "key", "value"),
            error_hint=_error_hint if causal or S == T else _non_causal_error_hint,
            **extra,
        )
        with torch.no_grad():
            mistakes = _named_apart(
                _linear_mistakes(q.double(), k.double(), v.double(), causal), want
            )
        try:
            expect_close(
                got,
                want.detach(),
                f"the output of {call}",
                mistakes=mistakes,
                hints=[keep_float64_hint(want.detach())],
                dtype_hint=_DTYPE_HINT,
            )
        except CaseFailed as failed:
            if not pass_causal and _right_when_told(candidate, q, k, v, want):
                raise CaseFailed(
                    f"the output of {call} is wrong, and with causal=True passed it is "
                    f"right\nLikely mistake: {says('linear-default-not-causal')}."
                ) from None
            raise failed
        if grad:
            upstream = randn(*want.shape, seed=seed + 9).to(want.dtype)
            want.backward(upstream)
            if not got.requires_grad:
                raise CaseFailed(
                    "the output does not require grad, so no gradient can flow back to q, k "
                    "and v: no `torch.no_grad()`, `.detach()`, `.data` or `.numpy()`"
                )
            call_student(
                got.backward,
                upstream.to(got.dtype),
                what="backpropagating through your output",
                error_hint=_error_hint,
            )
            for name, a, b in zip(("`query`", "`key`", "`value`"), mine, theirs, strict=True):
                expect_grad(a.grad, b.grad, name)

    return run


def _linear_refuses(candidate):
    """causal=True with S != T has no meaning (position i sees keys 0..i of a sequence of
    its own length): a ValueError naming `causal`."""

    def run():
        # more keys than queries, then fewer: a guard on S > T alone does not pass
        for T, S, seed in ((4, 6, 2291), (6, 4, 2295)):
            q, k, v = (
                randn(2, T, 3, seed=seed),
                randn(2, S, 3, seed=seed + 1),
                randn(2, S, 3, seed=seed + 2),
            )
            expect_value_error(
                lambda q=q, k=k, v=v: candidate(q, k, v, causal=True),
                f"linear_attention(q (2, {T}, 3), k (2, {S}, 3), v (2, {S}, 3), causal=True)",
                "causal",
                example="causal=True needs as many keys as queries, got S={S} for T={T}",
                other_error="raise ValueError (not another exception) for S != T when causal, "
                "fewer keys than queries (S < T) as well as more (S > T)",
                returned="with causal=True position i sees keys 0..i of its own sequence, so "
                "S must equal T (S < T as well as S > T); raise ValueError naming `causal`",
            )

    return run


@checker(
    "linear_attention",
    chapter="22_linear_attention",
)
def check_linear_attention(candidate) -> list[Case]:
    """Check ``linear_attention(query, key, value, causal=True)``: phi(x) = elu(x) + 1,
    out_i = phi(q_i)^T S_i / phi(q_i)^T z_i with S_i = sum_j phi(k_j) v_j^T and
    z_i = sum_j phi(k_j), over j <= i when causal (S = T, else ValueError), over every j
    otherwise; q ``(..., T, Dk)``, k ``(..., S, Dk)``, v ``(..., S, Dv)``."""
    return [
        Case(
            "causal (the default), B=2, H=2, T=6, Dk=4, Dv=3",
            _linear_case(candidate, (2, 2), 6, 6, 4, 3, 2201, pass_causal=False),
            covers=frozenset({"Dk!=Dv", "leading dims", "dtype=float64"}),
        ),
        Case(
            "causal=True given, no leading axis: (T, D) = (9, 5), Dv=5",
            _linear_case(candidate, (), 9, 9, 5, 5, 2211),
            covers=frozenset({"no leading dims"}),
        ),
        Case(
            "causal=False, S=T=5 (every position sees every key), B=3, Dk=3, Dv=4",
            _linear_case(candidate, (3,), 5, 5, 3, 4, 2221, causal=False),
            covers=frozenset({"causal"}),
        ),
        Case(
            "causal=False, T=4 queries, S=7 keys, B=2, H=2, Dk=4, Dv=2",
            _linear_case(candidate, (2, 2), 4, 7, 4, 2, 2231, causal=False),
            covers=frozenset({"causal", "S!=T"}),
        ),
        Case(
            "three leading axes (2, 2, 2), T=5, Dk=Dv=3",
            _linear_case(candidate, (2, 2, 2), 5, 5, 3, 3, 2241),
            covers=frozenset({"leading dims"}),
        ),
        Case(
            "float32 inputs give float32 results, T=7",
            _linear_case(candidate, (2, 2), 7, 7, 4, 4, 2251, dtype=torch.float32),
            covers=frozenset({"dtype=float32"}),
        ),
        Case(
            "T=1: one position (the output is v)",
            _linear_case(candidate, (2, 1), 1, 1, 4, 3, 2261),
            weight=TRIVIAL,
            support=True,
            covers=frozenset({"T=1"}),
        ),
        Case(
            "gradients flow to q, k and v",
            _linear_case(candidate, (2, 2), 5, 5, 3, 4, 2271, grad=True),
            covers=frozenset({"grad"}),
        ),
        Case(
            "causal=True with S != T raises ValueError naming `causal`",
            _linear_refuses(candidate),
            weight=TRIVIAL,
            support=True,
            covers=frozenset({"causal S!=T raises"}),
        ),
    ]


# ---------------------------------------------------------------- the gated delta rule


def _delta_variant(q, k, v, g, beta, state, **mistake):
    """The gated delta rule token by token, with one mistake switched on (none: the right
    rule). q, k ``(B, T, H, Dk)``, v ``(B, T, H, Dv)``, g, beta ``(B, T, H)``, state
    ``(B, H, Dk, Dv)`` or None -> (output (B, T, H, Dv), state (B, H, Dk, Dv))."""
    if mistake.get("time_axis"):  # the recurrence over the heads: (B, T, H) read as (B, H, T)
        out, S = _delta_variant(
            *(x.transpose(1, 2) for x in (q, k, v, g, beta)), None, **mistake | {"time_axis": 0}
        )
        return out.transpose(1, 2), S
    if mistake.get("normalised"):  # q and k l2-normalised inside (the caller's job)
        q, k = _unit(q), _unit(k)
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # (B, H, T, D)
    g, beta = g.transpose(1, 2), beta.transpose(1, 2)  # (B, H, T)
    B, H, T, Dk = k.shape
    scale = 1.0 if mistake.get("unscaled") else 1.0 / math.sqrt(Dk)
    if state is None or mistake.get("no_initial"):
        S = torch.zeros(B, H, Dk, v.shape[-1], dtype=q.dtype, device=q.device)
    else:
        S = state
    update = mistake.get("update", "right")
    outputs = []
    for t in range(T):
        a = g[:, :, t, None, None]
        if mistake.get("decay_sign"):
            a = -a
        a = a if mistake.get("g_as_decay") else a.exp()
        if mistake.get("no_decay"):
            a = torch.ones_like(a)
        b = torch.ones_like(a) if mistake.get("no_beta") else beta[:, :, t, None, None]
        if mistake.get("one_minus_beta"):
            b = 1 - b
        kt, vt = k[:, :, t, :, None], v[:, :, t, None, :]  # (B, H, Dk, 1), (B, H, 1, Dv)
        read_before = mistake.get("read_before")
        if read_before == "old":
            outputs.append((S * q[:, :, t, :, None]).sum(dim=-2) * scale)
        elif read_before == "decayed":
            outputs.append((a * S * q[:, :, t, :, None]).sum(dim=-2) * scale)

        def read(M, kt=kt):
            return (M * kt).sum(dim=-2, keepdim=True)  # M^T k: (B, H, 1, Dv)

        if update == "decay after":
            S = a * (S + b * kt * (vt - read(S)))
        elif update == "undecayed read":
            S = a * S + b * kt * (vt - read(S))
        elif update == "beta on value":
            S = a * S + kt * (b * vt - read(a * S))
        elif update == "beta on whole":
            S = b * (a * S + kt * (vt - read(a * S)))
        elif update == "beta on read":
            S = a * S + kt * (vt - b * read(a * S))
        elif update == "no read":
            S = a * S + b * kt * vt
        else:
            S = a * S + b * kt * (vt - read(a * S))
        if not read_before:
            outputs.append((S * q[:, :, t, :, None]).sum(dim=-2) * scale)
    out = torch.stack(outputs, dim=2).transpose(1, 2)  # (B, T, H, Dv)
    if mistake.get("transposed"):
        S = S.transpose(-2, -1)
    return out, S


_DELTA_MISTAKES = (
    ("delta-decay-after-update", {"update": "decay after"}),
    ("delta-read-undecayed", {"update": "undecayed read"}),
    ("delta-beta-on-value-only", {"update": "beta on value"}),
    ("delta-beta-on-whole-update", {"update": "beta on whole"}),
    ("delta-beta-ignored", {"no_beta": True}),
    ("delta-decay-ignored", {"no_decay": True}),
    ("delta-g-used-as-decay", {"g_as_decay": True}),
    ("delta-scale-missing", {"unscaled": True}),
    ("delta-output-before-update", {"read_before": "old"}),
    ("delta-output-before-update", {"read_before": "decayed"}),
    ("delta-initial-state-ignored", {"no_initial": True}),
    ("delta-state-transposed", {"transposed": True}),
    ("delta-time-axis-wrong", {"time_axis": 1}),
    ("delta-qk-normalised", {"normalised": True}),
    ("delta-beta-on-read-only", {"update": "beta on read"}),
    ("delta-read-term-missing", {"update": "no read"}),
    ("delta-decay-sign", {"decay_sign": True}),
    ("delta-one-minus-beta", {"one_minus_beta": True}),
)


def _delta_mistakes(inputs, part: int):
    """(message, compute) for each mistake: ``part`` 0 the output, 1 the state."""

    def variant(options):
        return lambda: _delta_variant(*inputs, **options)[part]

    return [(says(key), variant(options)) for key, options in _DELTA_MISTAKES]


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def _delta_inputs(B, T, H, Dk, Dv, seed, *, initial, plain):
    """q of any length; k of length between 0.5 and 1 (the caller normalises the keys, as
    Qwen3-Next does, and may scale them: beta |k|^2 <= 1 keeps the state bounded; a rule
    that normalises q or k again is then seen); g in (-1, -0.05), beta in (0.1, 0.9)
    (``plain``: g = 0, beta = 1, the delta rule that overwrites); the initial state, or
    None."""
    q = randn(B, T, H, Dk, seed=seed)
    u = torch.rand(3, B, T, H, generator=generator(seed + 3), dtype=torch.float64)
    k = _unit(randn(B, T, H, Dk, seed=seed + 1)) * (0.5 + 0.5 * u[2, ..., None])
    v = randn(B, T, H, Dv, seed=seed + 2)
    if plain:
        g = torch.zeros(B, T, H, dtype=torch.float64)
        beta = torch.ones(B, T, H, dtype=torch.float64)
    else:
        g = -(0.05 + 0.95 * u[0])
        beta = 0.1 + 0.8 * u[1]
    state = randn(B, H, Dk, Dv, seed=seed + 4) if initial else None
    return q, k, v, g, beta, state


def _delta_case(
    candidate, B, T, H, Dk, Dv, seed, *, initial=False, plain=False, dtype=torch.float64, grad=False
):
    def run():
        inputs = _delta_inputs(B, T, H, Dk, Dv, seed, initial=initial, plain=plain)
        inputs = [None if x is None else x.to(dtype) for x in inputs]
        q, k, v, g, beta, state = inputs
        mine, theirs = leaves(q, k, v, g, beta, grad=grad)
        want_out, want_state = ref_linear.gated_delta_rule(*theirs, initial_state=state)
        given = "" if state is None else f", initial_state {fmt_shape(state.shape)}"
        call = (
            f"gated_delta_rule(q, k {fmt_shape(q.shape)}, v {fmt_shape(v.shape)}, g, beta "
            f"{fmt_shape(g.shape)}{given})"
        )
        extra = {} if state is None else {"initial_state": state}
        got = call_student(
            candidate,
            *mine,
            what=call,
            arg_names=("query", "key", "value", "g", "beta"),
            error_hint=_error_hint,
            **extra,
        )
        got = expect_tuple(got, 2, call, ("output", "state"))
        with torch.no_grad():
            doubled = [None if x is None else x.double() for x in inputs]
        for part, (mine_part, want, what) in enumerate(
            (
                (got[0], want_out, f"the output of {call}"),
                (got[1], want_state, f"the state returned by {call}"),
            )
        ):
            with torch.no_grad():
                mistakes = _named_apart(_delta_mistakes(doubled, part), want)
            expect_close(
                mine_part,
                want.detach(),
                what,
                mistakes=mistakes,
                hints=[keep_float64_hint(want.detach())],
                dtype_hint=_DTYPE_HINT,
            )
        if grad:
            up_out = randn(*want_out.shape, seed=seed + 8).to(dtype)
            up_state = randn(*want_state.shape, seed=seed + 9).to(dtype)
            ((want_out * up_out).sum() + (want_state * up_state).sum()).backward()
            if not (got[0].requires_grad and got[1].requires_grad):
                raise CaseFailed(
                    "the output or the state does not require grad, so no gradient can flow "
                    "back to the inputs: no `torch.no_grad()`, `.detach()`, `.data` or "
                    "`.numpy()`"
                )
            call_student(
                lambda: ((got[0] * up_out).sum() + (got[1] * up_state).sum()).backward(),
                what="backpropagating through your output and state",
                error_hint=_error_hint,
            )
            names = ("`query`", "`key`", "`value`", "`g`", "`beta`")
            for name, a, b in zip(names, mine, theirs, strict=True):
                expect_grad(a.grad, b.grad, name)

    return run


@checker(
    "gated_delta_rule",
    chapter="22_linear_attention",
)
def check_gated_delta_rule(candidate) -> list[Case]:
    """Check ``gated_delta_rule(query, key, value, g, beta, initial_state=None) -> (output,
    state)``, token by token: S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T with
    a_t = exp(g_t), o_t = S_t^T q_t / sqrt(Dk); q, k ``(B, T, H, Dk)``, v ``(B, T, H, Dv)``,
    g, beta ``(B, T, H)``, the state ``(B, H, Dk, Dv)``. ``chunk_size`` is never passed."""
    return [
        Case(
            "B=2, T=6, H=2, Dk=4, Dv=3, no initial state",
            _delta_case(candidate, 2, 6, 2, 4, 3, 2401),
            covers=frozenset({"B>1", "H>1", "Dk!=Dv", "dtype=float64", "g!=0", "beta!=1"}),
        ),
        Case(
            "initial_state given, B=1, T=5, H=3, Dk=Dv=4",
            _delta_case(candidate, 1, 5, 3, 4, 4, 2411, initial=True),
            covers=frozenset({"initial_state", "B=1"}),
        ),
        Case(
            "initial_state given, T=9, H=1, Dk=8, Dv=5",
            _delta_case(candidate, 2, 9, 1, 8, 5, 2421, initial=True),
            covers=frozenset({"initial_state", "H=1", "Dk!=Dv"}),
        ),
        Case(
            "g=0 and beta=1 (the delta rule that overwrites), T=7, H=2",
            _delta_case(candidate, 2, 7, 2, 4, 4, 2431, plain=True),
            covers=frozenset({"g=0", "beta=1"}),
        ),
        Case(
            "float32 inputs give float32 results",
            _delta_case(candidate, 2, 6, 2, 4, 4, 2441, initial=True, dtype=torch.float32),
            covers=frozenset({"dtype=float32"}),
        ),
        Case(
            "T=1: one token",
            _delta_case(candidate, 2, 1, 2, 4, 3, 2451),
            weight=TRIVIAL,
            covers=frozenset({"T=1"}),
        ),
        Case(
            "gradients flow to q, k, v, g and beta (through the output and the state)",
            _delta_case(candidate, 2, 5, 2, 3, 4, 2461, grad=True),
            covers=frozenset({"grad"}),
        ),
    ]
