"""Checker for exercise 14's ALiBi bias: ``alibi_bias(slopes, T, S=None) -> (H, T, S)``.

The additive mask of attention with linear biases (Press et al., 2022, "Train Short,
Test Long"): the ``T`` queries are the last ``T`` of ``S`` positions (query ``i`` sits at
``i + S - T``, as when new tokens meet a KV cache); a key ``j`` at or before the query
gets ``-slope_h * (distance back)``, a later key ``-inf`` (the causal mask, in the same
tensor). The expected values come from the package: :func:`attention_course.relative_positions.
alibi_bias` with the causal mask filled in, as :func:`~attention_course.relative_positions.
alibi_causal_mask` does for the model.

The named mistakes: a bias that *rewards* distance (the sign), the bias of the transposed
matrix (distance ``j - i``: the penalty lands on future keys and the past is masked),
future keys left with a finite bias (no causal mask, or the package's raw 0 there, or a
symmetric ``|i - j|``), the queries placed at the first ``T`` positions instead of the
last, and the slopes broadcast on the wrong axis.
"""

from __future__ import annotations

import torch

from attention_course import relative_positions as ref

from ._compare import _fmt_number, expect_close, fmt_shape
from ._runner import Case, CaseFailed, call_student, checker

# ---------------------------------------------------------------- known mistakes

ALIBI_SIGN = (
    "your bias rewards distance: +slope * (i - j) makes a far key *more* likely than a near "
    "one; ALiBi penalises distance, bias = -slope * (how far back the key is)"
)
ALIBI_TRANSPOSED = (
    "your bias is transposed (distance j - i, keys after the query): the penalty lands on "
    "future keys and the past is masked; query i may see keys j <= i, and key j's penalty "
    "grows with i - j"
)
ALIBI_NOT_CAUSAL = (
    "future keys are not masked: a key after the query must get -inf (the causal mask is "
    "part of this bias), here it got a finite value"
)
ALIBI_FIRST_QUERIES = (
    "with S > T your queries sit at positions 0 .. T - 1; they are the *last* T of the S "
    "positions (new tokens after S - T cached ones): query i is at position i + S - T"
)
ALIBI_HEAD_AXIS = (
    "the slopes are broadcast on the wrong axis: head h must use slope h on every (query, "
    "key) entry, bias[h] = -slopes[h] * distance; put the head axis first, "
    "`slopes[:, None, None]` times a (T, S) distance"
)

ALIBI_HALF = (
    "your penalties are half the reference's: the bias is -slope * distance, the slope "
    "itself (no factor 1/2)"
)
ALIBI_RECIPROCAL = (
    "you divided the distance by the slope: the bias is -slope * distance (a small slope "
    "means a gentle penalty, a head that looks far back)"
)
ALIBI_LOG = (
    "your penalty grows with the logarithm of the distance: ALiBi's penalty is linear, "
    "-slope * distance"
)
ALIBI_KEY_POSITION = (
    "your bias is slope * j (the key's position): it differs from -slope * (i - j) by "
    "slope * i, a constant along each row, which the softmax ignores (BLOOM's code uses that "
    "trick); the task asks for the bias itself, -slope * (how far back the key is)"
)
ALIBI_OFF_BY_ONE = (
    "the distance is off by one: the key at the query's own position is at distance 0 "
    "(bias 0), the key before it at distance 1"
)
ALIBI_DIAGONAL = (
    "the query's own key is masked: a query sees the keys at or before its position "
    "(mask only keys j > i + S - T; its own key gets bias 0)"
)
ALIBI_FIRST_QUERIES_MASK = (
    "the bias is right but the causal mask hides keys j > i, as if the queries sat at "
    "positions 0 .. T - 1 (`triu(1)` of a (T, S) matrix, or the mask built before the "
    "offset): with S > T query i is at position i + S - T and sees every key j <= i + S - T "
    "(`torch.ones(T, S).triu(S - T + 1)` marks the future keys)"
)
ALIBI_NAN = (
    "future keys hold NaN: fill them with `float('-inf')`; a NaN in the scores makes the "
    "whole softmax row NaN"
)
ALIBI_LARGE_FINITE = (
    "future keys hold a large finite number (such as -1e9) instead of -inf: fill them with "
    "`float('-inf')`, or with the dtype's most negative number, `torch.finfo(dtype).min`, "
    "as the statement says"
)


def _distance(T: int, S: int) -> torch.Tensor:
    """(T, S) int: how far key j lies before query i (negative for future keys)."""
    query_pos = torch.arange(S - T, S)[:, None]  # (T, 1): absolute positions
    return query_pos - torch.arange(S)[None, :]  # (T, S)


def expected_bias(slopes: torch.Tensor, T: int, S: int) -> torch.Tensor:
    """The package's bias for these slopes, with -inf on future keys: (H, T, S)."""
    H = slopes.shape[0]
    package = ref.alibi_bias(H, T, S, dtype=torch.float64)  # (H, T, S) for alibi_slopes(H)
    unit = package / ref.alibi_slopes(H).to(torch.float64)[:, None, None]  # -distance, >= 0 masked
    bias = slopes.to(torch.float64)[:, None, None] * unit  # (H, T, S)
    return bias.masked_fill(_distance(T, S) < 0, float("-inf")).to(slopes.dtype)


def _mistakes(slopes: torch.Tensor, T: int, S: int):
    d = _distance(T, S).to(torch.float64)  # (T, S)
    s = slopes.to(torch.float64)[:, None, None]  # (H, 1, 1)
    future = d < 0
    inf = float("-inf")
    dtype = slopes.dtype

    def masked(values, hide):
        return values.masked_fill(hide, inf).to(dtype)

    first = torch.arange(T)[:, None] - torch.arange(S)[None, :]  # queries at 0 .. T - 1
    out = [
        (ALIBI_SIGN, lambda: masked(s * d, future)),
        (ALIBI_TRANSPOSED, lambda: masked(s * d, ~future & (d != 0))),
        (ALIBI_TRANSPOSED, lambda: masked(-s * -d, ~future & (d != 0))),
        (ALIBI_NOT_CAUSAL, lambda: (-s * d.abs()).to(dtype)),
        (ALIBI_NOT_CAUSAL, lambda: (-s * d.clamp(min=0)).to(dtype)),
        (ALIBI_NOT_CAUSAL, lambda: (-s * d).to(dtype)),
        (ALIBI_FIRST_QUERIES, lambda: masked(-s * first, first < 0)),
        (ALIBI_HALF, lambda: masked(-0.5 * s * d, future)),
        (ALIBI_RECIPROCAL, lambda: masked(-d / s, future)),
        (ALIBI_LOG, lambda: masked(-s * torch.log1p(d.clamp(min=0)), future)),
        (ALIBI_LOG, lambda: masked(-s * torch.log(d.clamp(min=1)), future)),
        (ALIBI_KEY_POSITION, lambda: masked(s * torch.arange(S).to(d.dtype), future)),
        (ALIBI_OFF_BY_ONE, lambda: masked(-s * (d + 1), future)),
        (ALIBI_OFF_BY_ONE, lambda: masked(-s * (d - 1), future)),
        (ALIBI_OFF_BY_ONE, lambda: masked(-s * (d - 1).clamp(min=0), future)),
        (ALIBI_DIAGONAL, lambda: masked(-s * d, d <= 0)),
        (ALIBI_FIRST_QUERIES_MASK, lambda: masked(-s * d, first < 0)),
        (ALIBI_NAN, lambda: (-s * d).masked_fill(future, float("nan")).to(dtype)),
    ]
    if slopes.shape[0] == T:  # (T, H, S) has the expected shape only when H == T
        out.append((ALIBI_HEAD_AXIS, lambda: masked(-s * d, future).transpose(0, 1)))
    return out


def _shape_hint(got, slopes: torch.Tensor, T: int, S: int) -> str | None:
    if not isinstance(got, torch.Tensor):
        return None
    H = slopes.shape[0]
    shape = tuple(got.shape)
    if shape in ((T, H, S), (T, S, H), (S, T, H)) and shape != (H, T, S):
        return ALIBI_HEAD_AXIS
    if shape == (T, S):
        return "the head axis is missing: return one (T, S) bias per head, (H, T, S)"
    if shape == (H, S, T) and S != T:
        return ALIBI_TRANSPOSED
    return None


def _slopes(H: int, dtype: torch.dtype) -> torch.Tensor:
    return ref.alibi_slopes(H).to(dtype)


def _bias_case(candidate, H: int, T: int, S: int | None, dtype=torch.float64):
    def run():
        slopes = _slopes(H, dtype)
        keys = T if S is None else S
        expected = expected_bias(slopes, T, keys)
        args = (slopes, T) if S is None else (slopes, T, S)
        what = f"alibi_bias(slopes, {T}" + ("" if S is None else f", {S}") + ")"
        got = call_student(candidate, *args, what=what, arg_names=("slopes",))
        hint = _shape_hint(got, slopes, T, keys)
        if hint and tuple(got.shape) != tuple(expected.shape):
            raise CaseFailed(
                f"the bias of {what}: expected shape {fmt_shape(expected.shape)} (H, T, S), "
                f"got {fmt_shape(got.shape)}\nLikely mistake: {hint}."
            )
        if isinstance(got, torch.Tensor) and got.shape == expected.shape:
            # A large negative number instead of -inf hides future keys just as well.
            low = torch.finfo(got.dtype).min if got.is_floating_point() else None
            if low is not None:
                got = got.masked_fill(got <= low / 2, float("-inf"))
                future = torch.isinf(expected)
                held = got.detach().cpu().to(torch.float64)[future]
                if len(held) and bool(torch.isfinite(held).all() & (held <= -1e4).all()):
                    raise CaseFailed(
                        f"the bias of {what}: future keys hold {_fmt_number(float(held[0]))}, "
                        f"not -inf\nLikely mistake: {ALIBI_LARGE_FINITE}."
                    )
        expect_close(
            got,
            expected,
            f"the bias of {what}",
            mistakes=_mistakes(slopes, T, keys),
            dtype_hint="return the bias in the slopes' dtype",
        )

    return run


@checker("alibi_bias")
def check_alibi_bias(candidate) -> list[Case]:
    """Check ``alibi_bias(slopes, T, S=None) -> (H, T, S)``: ``-slope_h * ((i + S - T) - j)``
    for keys ``j <= i + S - T``, ``-inf`` for later keys."""
    return [
        Case("H = 2, T = S = 5", _bias_case(candidate, 2, 5, None)),
        Case(
            "H = 4, T = 3 queries after S - T = 4 cached positions (S = 7)",
            _bias_case(candidate, 4, 3, 7),
            covers=frozenset({"S", "S>T"}),
        ),
        Case(
            "H = T = 4, S = 6: the head axis cannot hide behind the shape",
            _bias_case(candidate, 4, 4, 6),
            covers=frozenset({"S", "S>T", "H=T"}),
        ),
        Case(
            "one new token (T = 1) after 5 cached ones, H = 8",
            _bias_case(candidate, 8, 1, 6),
            covers=frozenset({"S", "T=1"}),
        ),
        Case(
            "H = 6 (slopes not a power of 2), T = S = 6, float32",
            _bias_case(candidate, 6, 6, 6, torch.float32),
            covers=frozenset({"S", "dtype=float32"}),
        ),
        Case("H = 1, T = S = 3", _bias_case(candidate, 1, 3, None), covers=frozenset({"H=1"})),
    ]
