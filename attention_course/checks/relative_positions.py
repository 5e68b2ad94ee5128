"""Checkers for chapter 14's relative positions: ``apply_rope(x, positions=None,
base=10000.0)`` (rotary embeddings, half-split layout) and ``alibi_slopes(num_heads)``.

Each compares with the reference over a grid of inputs and names the mistake when the
output equals a known wrong implementation (interleaved pairs, the exponent ``i/Dh``,
positions from 1, the rotation's sign flipped, the base ignored, (B, T) positions
broadcast for a 4-D x only, angles in float32, ...). Positions from 1 are named as a
mistake of ``apply_rope``'s contract although, inside attention, shifting every position
by the same amount changes no score (scores depend on m - n only); the message says so.
Rotating the *values* as well cannot be seen from ``apply_rope`` alone (it rotates
whatever it is given): exercise 14's computed question ``14.rope_attention``
(:func:`~attention_course.checks.quiz_computed.rope_attention_cases`) names it."""

from __future__ import annotations

import math

import torch

from attention_course import relative_positions as ref

from ._compare import expect_close, expect_grad, expect_tensor
from ._data import leaf, randn
from ._runner import TRIVIAL, Case, CaseFailed, NotImplementedYet, call_student, checker

# ---------------------------------------------------------------- apply_rope: known mistakes


def _rope(
    x,
    positions,
    base,
    *,
    layout="half",
    exponent=2.0,
    sign=1.0,
    swap=False,
    halves="right",
    fixed_head_axis=False,
):
    """RoPE the right way, or with one known mistake (an independent implementation).

    ``exponent`` is the factor of ``i/Dh`` in the frequencies (``"linspace"``: exponents
    ``-linspace(0, 1, Dh/2)``); ``halves``: ``"swapped"`` concatenates the two halves in
    the wrong order, ``"second sign"`` flips the sign of ``x1 sin`` in the second half;
    ``fixed_head_axis``: (B, T) positions always broadcast as ``(B, 1, T, Dh/2)``.
    """
    T, Dh = x.shape[-2], x.shape[-1]
    half = Dh // 2
    work = torch.float64
    i = torch.arange(half, dtype=work)
    if exponent == "linspace":
        inv_freq = float(base) ** -torch.linspace(0, 1, half, dtype=work)
    else:
        inv_freq = float(base) ** (-exponent * i / Dh)  # (Dh/2,)
    angles = sign * positions.to(work)[..., None] * inv_freq  # (T, Dh/2) or (B, T, Dh/2)
    if positions.dim() == 2:
        between = 1 if fixed_head_axis else x.dim() - 3
        angles = angles.view(angles.shape[0], *([1] * between), T, half)
    cos, sin = angles.cos(), angles.sin()
    if swap:
        cos, sin = sin, cos
    xd = x.to(work)
    if layout == "half":
        x1, x2 = xd[..., :half], xd[..., half:]
        first, second = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        if halves == "swapped":
            first, second = second, first
        elif halves == "second sign":
            second = x2 * cos - x1 * sin
        out = torch.cat([first, second], dim=-1)
    else:  # interleaved: (2i, 2i + 1)
        x1, x2 = xd[..., 0::2], xd[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    return out.to(x.dtype)


def _rope_mistakes(x, positions, base):
    def rope(**kwargs):
        return lambda: _rope(x, positions, base, **kwargs)

    mistakes = [
        (
            "interleaved pairs: you paired feature 2i with 2i + 1 (RoFormer / GPT-J layout); "
            "apply_rope uses the half-split layout, feature i with i + Dh/2: "
            "`x1, x2 = x[..., :Dh // 2], x[..., Dh // 2:]`",
            rope(layout="interleaved"),
        ),
        (
            "the exponent is i/Dh instead of 2i/Dh: the frequency of pair i is "
            "base^(-2i/Dh), `inv_freq = base ** (-2 * i / Dh)` for i = 0 .. Dh/2 - 1",
            rope(exponent=1.0),
        ),
        (
            "the exponent has the wrong sign: the frequencies must fall along the pairs, "
            "theta_i = p * base^(-2i/Dh), not p * base^(+2i/Dh)",
            rope(exponent=-2.0),
        ),
        (
            "positions start at 1: the first token is at position 0 (no rotation), "
            "`positions = torch.arange(T)`. Inside attention this shift alone would cancel "
            "(a score depends on m - n only when q and k are shifted alike), but apply_rope "
            "must return the rotation at the positions it is given",
            lambda: _rope(x, positions + 1, base),
        ),
        (
            "the rotation's sign is flipped (you rotate by -theta): out[i] = x[i] cos - "
            "x[i + Dh/2] sin and out[i + Dh/2] = x[i + Dh/2] cos + x[i] sin",
            rope(sign=-1.0),
        ),
        (
            "cos and sin are swapped: out[i] = x[i] * cos(theta) - x[i + Dh/2] * sin(theta)",
            rope(swap=True),
        ),
        (
            "the base is ignored: you used 10000 where the call passed base="
            f"{base!r}; use the `base` argument in base ** (-2i/Dh)",
            lambda: _rope(x, positions, 10000.0),
        ),
        (
            "the positions argument is ignored: you rotated at torch.arange(T); rotate at "
            "the given `positions`",
            lambda: _rope(x, torch.arange(x.shape[-2]), base),
        ),
        (
            "the two halves are concatenated in the wrong order: the first half of the "
            "output is x1 cos - x2 sin, the second x2 cos + x1 sin",
            rope(halves="swapped"),
        ),
        (
            "the second half's sign: out[i + Dh/2] = x[i + Dh/2] cos + x[i] sin (plus, "
            "not minus: a rotation, not a reflection)",
            rope(halves="second sign"),
        ),
        (
            "every pair turns at the same frequency (base^0 = 1): `2 * i // Dh` is integer "
            "division; use a float exponent, `base ** (-2 * i / Dh)`",
            rope(exponent=0.0),
        ),
        (
            "the frequencies run from 1 down to 1/base: pair i turns at base^(-2i/Dh) for "
            "i = 0 .. Dh/2 - 1, so the last is base^(-(Dh - 2)/Dh), not 1/base "
            "(`torch.linspace(0, 1, Dh // 2)` is not 2i/Dh)",
            rope(exponent="linspace"),
        ),
    ]
    if positions.dim() == 2:
        mistakes += [
            (
                "every sequence got the positions of row 0: row b of `positions` belongs to "
                "x[b]; reshape the (B, T, Dh/2) angles to (B, 1, .., 1, T, Dh/2)",
                lambda: _rope(x, positions[0], base),
            ),
            (
                "each sequence was rotated with another row of `positions`: row b belongs "
                "to x[b] (x's first axis), not to another axis",
                lambda: _rope(x, positions.flip(0), base),
            ),
            (
                "the (B, T) positions are broadcast with a fixed head axis (`unsqueeze(1)`, "
                "as if x were always (B, H, T, Dh)): x may be (B, T, Dh) or have several "
                "axes between B and T; reshape the angles to (B, 1, .., 1, T, Dh/2) with "
                "x.dim() - 3 ones",
                lambda: _rope(x, positions, base, fixed_head_axis=True),
            ),
        ]
    return mistakes


def _describe(x, positions, base, given_positions: bool) -> str:
    args = [f"x {tuple(x.shape)} {str(x.dtype).replace('torch.', '')}"]
    if given_positions:
        args.append(f"positions {tuple(positions.shape)}")
    if base != 10000.0:
        args.append(f"base={base}")
    return "apply_rope(" + ", ".join(args) + ")"


def _float32_angles_hint(x, positions, expected):
    """A hint for float64 results that are right to about 4 digits only at large positions:
    the angles (positions x frequencies) computed in float32."""

    def hint(got):
        if x.dtype != torch.float64 or int(positions.abs().max()) < 100:
            return None
        error = float((got.to(torch.float64) - expected).abs().max())
        if not error <= 1e-3 * (1.0 + float(expected.abs().max())):
            return None
        return (
            "your values agree with the reference to about 4 digits only, as if the angles "
            "were computed in float32: compute them (positions x frequencies) in float64, "
            "`positions.to(torch.float64)[..., None] * base ** (-2 * i / Dh)` with i float64 "
            "(at position 1000 float32 angles are off by about 1e-5), and only then convert "
            "cos and sin to x.dtype"
        )

    return hint


def _broadcast_error_hint(positions):
    if positions is None or positions.dim() != 2:
        return None
    return (
        "positions (B, T) go with x's first axis and with T: reshape the (B, T, Dh/2) angles "
        "to (B, 1, .., 1, T, Dh/2), one 1 for each of the x.dim() - 3 axes between them (none "
        "for x (B, T, Dh))"
    )


def _rope_case(candidate, shape, *, seed, positions=None, base=10000.0, dtype=torch.float64):
    def run():
        x = randn(*shape, seed=seed, dtype=dtype)
        kwargs = {}
        if positions is not None:
            kwargs["positions"] = positions.clone()
        if base != 10000.0:
            kwargs["base"] = base
        used = torch.arange(shape[-2]) if positions is None else positions
        expected = ref.apply_rope(x, used, base)
        what = _describe(x, used, base, positions is not None)
        got = call_student(
            candidate,
            x.clone(),
            what=what,
            arg_names=("x",),
            error_hint=_broadcast_error_hint(positions),
            **kwargs,
        )
        expect_close(
            got,
            expected,
            f"the output of {what}",
            mistakes=_rope_mistakes(x, used, base),
            hints=[_float32_angles_hint(x, used, expected)],
        )

    return run


def _odd_case(candidate):
    def run():
        x = randn(2, 4, 5, seed=41)
        what = "apply_rope(x (2, 4, 5)) with an odd Dh = 5"
        try:
            candidate(x)
        except ValueError:
            return
        except NotImplementedError as error:
            raise NotImplementedYet(str(error)) from None
        except Exception as error:  # noqa: BLE001 - any other exception is a failed case
            raise CaseFailed(
                f"{what} raised {type(error).__name__}: {error}\nHint: check Dh at the top of "
                "the function and raise ValueError (features pair up, so Dh must be even)."
            ) from None
        raise CaseFailed(
            f"{what} returned without raising: features pair up, so raise ValueError when "
            "x.shape[-1] is odd"
        )

    return run


def _grad_case(candidate):
    def run():
        x0 = randn(2, 2, 5, 6, seed=42)
        positions = torch.tensor([0, 3, 4, 9, 20])
        x_student, x_ref = leaf(x0), leaf(x0)
        upstream = randn(2, 2, 5, 6, seed=43)
        what = "apply_rope(x (2, 2, 5, 6), positions) with x.requires_grad"
        got = call_student(candidate, x_student, positions, what=what, arg_names=("x",))
        got = expect_tensor(got, f"the output of {what}")
        if not got.requires_grad:
            raise CaseFailed(
                f"the output of {what} does not require grad: compute it from x with tensor "
                "operations (no `.detach()`, `.numpy()` or `torch.tensor(...)` of values)"
            )
        if tuple(got.shape) != tuple(x0.shape):
            raise CaseFailed(
                f"the output of {what} has shape {tuple(got.shape)}, expected {tuple(x0.shape)}"
            )
        (got * upstream).sum().backward()
        (ref.apply_rope(x_ref, positions) * upstream).sum().backward()
        expect_grad(x_student.grad, x_ref.grad, "x")

    return run


_SOLE = 1.5
"""The weight of a case that alone tests one requirement (the 5-D broadcast, large positions,
the odd-Dh error, gradients): failing it alone must keep the score below 0.9."""


@checker("apply_rope")
def check_apply_rope(candidate) -> list[Case]:
    """Check ``apply_rope(x, positions=None, base=10000.0) -> same shape as x``: the
    half-split rotary embedding, theta_i = p * base^(-2i/Dh)."""
    return [
        Case(
            "x (2, 3, 6, 8), default positions 0 .. 5",
            _rope_case(candidate, (2, 3, 6, 8), seed=1),
            covers=frozenset({"dtype=float64", "x (B, H, T, Dh)"}),
        ),
        Case(
            "x (7, 16) 2-D, positions 3 .. 9",
            _rope_case(candidate, (7, 16), seed=2, positions=torch.arange(3, 10)),
            covers=frozenset({"positions", "x (T, Dh)"}),
        ),
        Case(
            "x (4, 12), base=100.0",
            _rope_case(candidate, (4, 12), seed=3, base=100.0),
            covers=frozenset({"base"}),
        ),
        Case(
            "x (2, 3, 5, 4) float32, positions (B=2, T=5): one row per sequence",
            _rope_case(
                candidate,
                (2, 3, 5, 4),
                seed=4,
                positions=torch.tensor([[7, 8, 9, 10, 11], [0, 1, 2, 3, 4]]),
                dtype=torch.float32,
            ),
            covers=frozenset({"positions", "positions=(B, T)", "dtype=float32"}),
        ),
        Case(
            "x (2, 5, 4) 3-D, positions (B=2, T=5): no axis between B and T",
            _rope_case(
                candidate,
                (2, 5, 4),
                seed=8,
                positions=torch.tensor([[3, 4, 5, 6, 7], [20, 21, 22, 23, 24]]),
            ),
            covers=frozenset({"positions", "positions=(B, T)", "x (B, T, Dh)"}),
        ),
        Case(
            "x (2, 3, 2, 5, 4) 5-D, positions (B=2, T=5): two axes between B and T",
            _rope_case(
                candidate,
                (2, 3, 2, 5, 4),
                seed=9,
                positions=torch.tensor([[5, 6, 7, 8, 9], [1, 2, 3, 4, 5]]),
            ),
            weight=_SOLE,
            covers=frozenset({"positions", "positions=(B, T)", "x 5-D"}),
        ),
        Case(
            "x (3, 2): one feature pair, positions 0 .. 2",
            _rope_case(candidate, (3, 2), seed=5),
            covers=frozenset({"Dh=2"}),
        ),
        Case(
            "T = 1 at position 0: the identity",
            _rope_case(candidate, (2, 1, 6), seed=6),
            weight=TRIVIAL,
            covers=frozenset({"T=1"}),
            support=True,
        ),
        Case(
            "long positions (up to 1000) with base=500.0",
            _rope_case(
                candidate, (4, 10), seed=7, positions=torch.tensor([0, 1, 999, 1000]), base=500.0
            ),
            weight=_SOLE,
            covers=frozenset({"positions", "base"}),
        ),
        Case(
            "odd Dh raises ValueError",
            _odd_case(candidate),
            weight=_SOLE,
            covers=frozenset({"odd Dh"}),
            support=True,
        ),
        Case(
            "gradients flow to x", _grad_case(candidate), weight=_SOLE, covers=frozenset({"grad"})
        ),
    ]


# ---------------------------------------------------------------- alibi_slopes


def _slopes_for(n: int) -> list[float]:
    return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]


def _slope_mistakes(H: int):
    n = 2 ** int(math.floor(math.log2(H)))
    big = 2 ** math.ceil(math.log2(H))

    def t(values):
        return lambda: torch.tensor(values, dtype=torch.float32)

    mistakes = []
    if H == 1:
        mistakes.append(
            (
                "for H = 1 the slope is 2^-8 = 1/256, what the power-of-2 formula "
                "2^(-8(h + 1)/H) gives for H = 1, h = 0: no special case is needed",
                t([1.0]),
            )
        )
    if n != H:
        mistakes += [
            (
                f"for H = {H} the extra slopes come first: take the n = {n}-head slopes "
                "first, then the extra 2n-head slopes at even indices after them, "
                "`slopes_n + slopes_2n[0::2][:H - n]`",
                t(_slopes_for(2 * n)[0::2][: H - n] + _slopes_for(n)),
            ),
            (
                f"the slopes are sorted: for H = {H} the extra 2n-head slopes go after the "
                f"n = {n}-head slopes, as in the paper's code, even though the first extra "
                "one is larger (do not sort)",
                t(sorted(ref.alibi_slopes(H).tolist(), reverse=True)),
            ),
            (
                f"for H = {H} you took the first H slopes of the next power of 2 "
                f"({big} heads): n = 2^floor(log2 H) = {n}; take the {n}-head slopes, then "
                "the 2n-head slopes at even indices",
                t(_slopes_for(big)[:H]),
            ),
        ]
    mistakes += [
        (
            "the exponent starts at h = 0: slope_h = 2^(-8(h + 1)/H), so the first slope is "
            "2^(-8/H), not 1",
            t([2.0 ** (-8.0 * h / H) for h in range(H)]),
        ),
        (
            "the slopes are in reverse order: head 0 has the largest slope, 2^(-8/H)",
            t(list(reversed(ref.alibi_slopes(H).tolist()))),
        ),
        (
            "the slopes ignore H: you used 2^-(h+1) (right only for 8 heads); the ratio is "
            "2^(-8/H)",
            t([2.0 ** -(h + 1) for h in range(H)]),
        ),
        (
            "positive exponent: the slopes must fall, 2^(-8(h+1)/H), all below 1",
            t([2.0 ** (8.0 * (h + 1) / H) for h in range(H)]),
        ),
        (
            "the slopes are negative: return the positive slopes s_h; the minus sign "
            "belongs to the bias, -s_h (i - j)",
            t([-v for v in ref.alibi_slopes(H).tolist()]),
        ),
    ]
    if n != H:
        mistakes += [
            (
                f"for H = {H} (not a power of 2) you used the power-of-2 formula "
                "2^(-8(h+1)/H) directly: take the slopes for n = 2^floor(log2 H) heads, then "
                "the first H - n slopes for 2n heads at even indices (0, 2, 4, ..)",
                t(_slopes_for(H)),
            ),
            (
                f"for H = {H} the extra slopes are taken at odd indices: take the 2n-head "
                "slopes at even indices, `slopes_2n[0::2][:H - n]`",
                t(_slopes_for(n) + _slopes_for(2 * n)[1::2][: H - n]),
            ),
            (
                f"for H = {H} the extra slopes are taken from the start of the 2n-head list "
                "(not at even indices): `slopes_2n[0::2][:H - n]`",
                t(_slopes_for(n) + _slopes_for(2 * n)[: H - n]),
            ),
        ]
    return mistakes


def _slopes_case(candidate, H: int):
    def run():
        expected = ref.alibi_slopes(H)
        what = f"alibi_slopes({H})"
        got = call_student(candidate, H, what=what)
        expect_close(
            got,
            expected,
            f"the slopes of {what}",
            mistakes=_slope_mistakes(H),
            dtype_hint="return float32 slopes, `torch.tensor(slopes, dtype=torch.float32)`",
        )

    return run


@checker("alibi_slopes")
def check_alibi_slopes(candidate) -> list[Case]:
    """Check ``alibi_slopes(num_heads) -> (H,)``: 2^(-8(h+1)/H) for H a power of 2, the
    paper's interleaving rule otherwise."""
    return [
        Case(
            "H = 8: 1/2, 1/4, .., 1/256",
            _slopes_case(candidate, 8),
            covers=frozenset({"power of 2"}),
        ),
        Case("H = 4", _slopes_case(candidate, 4), covers=frozenset({"power of 2"})),
        Case("H = 16", _slopes_case(candidate, 16), covers=frozenset({"power of 2"})),
        # Not TRIVIAL: a special case for H = 1 is a mistake of its own (the formula gives
        # 2^-8), so the case carries a full weight.
        Case("H = 1: 2^-8", _slopes_case(candidate, 1), covers=frozenset({"H=1"})),
        Case(
            "H = 6 (not a power of 2)",
            _slopes_case(candidate, 6),
            covers=frozenset({"not a power of 2"}),
        ),
        Case(
            "H = 12 (not a power of 2)",
            _slopes_case(candidate, 12),
            covers=frozenset({"not a power of 2"}),
        ),
        Case(
            "H = 3 (not a power of 2)",
            _slopes_case(candidate, 3),
            covers=frozenset({"not a power of 2"}),
        ),
    ]
