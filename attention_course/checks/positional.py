"""Checker for the sinusoidal positional encoding."""

from __future__ import annotations

import torch

from attention_course import positional as ref

from ._compare import expect_close
from ._runner import TRIVIAL, Case, call_student, checker

_ODD_WIDTH = (
    "with an odd d_model there are ceil(d/2) sine columns (0, 2, ..., d-1) but only "
    "floor(d/2) cosine columns: fill `pe[:, 1::2]` with the cosines of the first d // 2 "
    "angles, `torch.cos(angle[:, : d_model // 2])`"
)


def _table(
    max_len: int, d_model: int, *, exponent, swap=False, base=10000.0, start=0, interleave=True
):
    """A sinusoidal table built with a given exponent rule for column j."""
    p = torch.arange(start, start + max_len, dtype=torch.float64)[:, None]  # (L, 1)
    j = torch.arange(d_model, dtype=torch.float64)  # (D,)
    angle = p / base ** (exponent(j) / d_model)  # (L, D)
    even = (j % 2 == 0) if interleave else (j < (d_model + 1) // 2)
    if not interleave:
        # [sin | cos] halves: column j of each half uses pair index j (resp. j - half).
        half = (d_model + 1) // 2
        i = torch.where(j < half, j, j - half)
        angle = p / base ** (2 * i / d_model)
    sin, cos = torch.sin(angle), torch.cos(angle)
    if swap:
        sin, cos = cos, sin
    return torch.where(even, sin, cos)


def _pe_mistakes(max_len: int, d_model: int, dtype: torch.dtype):
    pair = lambda j: 2 * torch.div(j, 2, rounding_mode="floor")  # noqa: E731 - 2i for column j

    def table(**kwargs):
        return lambda: _table(max_len, d_model, **kwargs).to(dtype)

    return [
        (
            "sin and cos are swapped: even columns (2i) hold sin, odd columns (2i+1) hold cos",
            table(exponent=pair, swap=True),
        ),
        (
            "wrong exponent on the odd columns: you used the column index j, so column 2i+1 "
            "gets 10000^((2i+1)/d); both columns of a pair share the angle p / 10000^(2i/d)",
            table(exponent=lambda j: j),
        ),
        (
            "wrong exponent on the odd columns: column 2i+1 got 10000^(2(i+1)/d); both "
            "columns of a pair share the angle p / 10000^(2i/d)",
            table(exponent=lambda j: torch.where(j % 2 == 1, j + 1, j)),
        ),
        (
            "the exponent is i/d instead of 2i/d (i is the index of the sin/cos pair)",
            table(exponent=lambda j: torch.div(j, 2, rounding_mode="floor")),
        ),
        (
            "you concatenated [all sines | all cosines]: the columns interleave, sin in even "
            "columns and cos in odd ones",
            table(exponent=pair, interleave=False),
        ),
        ("the base is 1000: the formula uses 10000", table(exponent=pair, base=1000.0)),
        (
            "positions start at 1: the first row is position 0 (all sines 0, all cosines 1)",
            table(exponent=pair, start=1),
        ),
        (
            "for an odd d_model you built the table for d_model + 1 and dropped its last "
            "column: the exponent divides by d_model itself, 10000^(2i/d_model)",
            lambda: _table(max_len, d_model + 1, exponent=pair)[:, :d_model].to(dtype),
        ),
        (
            "the table is transposed: return (max_len, d_model)",
            lambda: _table(max_len, d_model, exponent=pair).T.contiguous().to(dtype),
        ),
    ]


def _pe_case(candidate, max_len: int, d_model: int):
    def run():
        expected = ref.sinusoidal_positional_encoding(max_len, d_model)
        got = call_student(
            candidate,
            max_len,
            d_model,
            what=f"sinusoidal_positional_encoding({max_len}, {d_model})",
            error_hint=_ODD_WIDTH if d_model % 2 == 1 else None,
        )
        expect_close(
            got,
            expected,
            "the table",
            mistakes=_pe_mistakes(max_len, d_model, expected.dtype),
            dtype_hint="return torch's default dtype (float32 unless changed); convert with "
            "`.to(torch.get_default_dtype())`",
        )

    return run


@checker("sinusoidal_positional_encoding")
def check_sinusoidal_positional_encoding(candidate) -> list[Case]:
    """Check ``sinusoidal_positional_encoding(max_len, d_model) -> (max_len, d_model)``."""
    return [
        Case("max_len=10, d_model=16", _pe_case(candidate, 10, 16), covers=frozenset({"even"})),
        Case("max_len=1, d_model=4 (position 0 only)", _pe_case(candidate, 1, 4), weight=TRIVIAL),
        Case("max_len=50, d_model=6", _pe_case(candidate, 50, 6), covers=frozenset({"even"})),
        Case("max_len=7, d_model=2 (one sin/cos pair)", _pe_case(candidate, 7, 2), weight=TRIVIAL),
        Case("max_len=20, d_model=32", _pe_case(candidate, 20, 32), covers=frozenset({"even"})),
        Case(
            "odd width: max_len=12, d_model=5 (3 sine, 2 cosine columns)",
            _pe_case(candidate, 12, 5),
            covers=frozenset({"odd"}),
        ),
        Case(
            "odd width: max_len=9, d_model=7 (4 sine, 3 cosine columns)",
            _pe_case(candidate, 9, 7),
            covers=frozenset({"odd"}),
        ),
    ]
