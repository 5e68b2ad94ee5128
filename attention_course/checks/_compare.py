"""Compare a student's tensor with the reference's and explain the difference.

`expect_close` is the workhorse: it checks the type, shape, dtype and
finiteness of what came back, compares the values, and on a mismatch tries
the known mistakes it was given (each a function computing what that mistake
would have produced on the same inputs) so that the message can name one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch

from ._runner import CaseFailed

# A known mistake: (what to tell the student, a function computing its output).
Mistake = tuple[str, Callable[[], object]]
# A property hint: a function of the student's output returning a message or None.
Hint = Callable[[torch.Tensor], "str | None"]

TOLERANCES = {
    # float64 arithmetic agrees with the reference to about 1e-15 relative, whatever the
    # order of the operations; float32 to about 1e-7. So a float64 result that is right to
    # 1e-7 only was computed in float32 somewhere inside (`x.float()` ... `.to(x.dtype)`),
    # which the statements forbid: the float64 tolerance must reject it.
    torch.float64: (1e-10, 1e-10),
    torch.float32: (2e-5, 1e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}

MATCH_TOLERANCES = {torch.float64: (1e-6, 1e-5)}
"""Looser tolerances for *naming* a mistake: a known mistake is recognised in a result
that also lost precision (an unbiased variance computed in float32 is still named)."""


def tolerances(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) used to compare tensors of ``dtype``."""
    return TOLERANCES.get(dtype, (1e-6, 1e-5))


def match_tolerances(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) used to recognise a known mistake in a result of ``dtype``."""
    return MATCH_TOLERANCES.get(dtype, tolerances(dtype))


def fmt_values(t: torch.Tensor, limit: int = 6) -> str:
    """A short, stable excerpt of numbers: ``[0.1234, -1.5, ...]``."""
    flat = t.detach().reshape(-1).cpu()
    if t.dtype == torch.bool:
        items = ["True" if bool(v) else "False" for v in flat[:limit]]
    elif t.is_floating_point():
        items = [_fmt_number(float(v)) for v in flat[:limit]]
    else:
        items = [str(int(v)) for v in flat[:limit]]
    more = ", ..." if flat.numel() > limit else ""
    return "[" + ", ".join(items) + more + "]"


def _fmt_number(x: float) -> str:
    if x != x:
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    text = f"{x:.4g}"
    return "0" if text in ("-0", "0") else text


def fmt_shape(shape) -> str:
    """``(2, 3)``, ``(5,)`` or ``()``, as Python prints a tuple."""
    return str(tuple(int(s) for s in shape))


def _row_excerpt(expected: torch.Tensor, got: torch.Tensor, index: tuple[int, ...]) -> str:
    """Both tensors' rows (last axis) at ``index``, e.g. ``[0, 2, :]``."""
    if expected.dim() == 0:
        return f"expected {fmt_values(expected)}, got {fmt_values(got)}"
    if expected.dim() == 1:
        return f"expected {fmt_values(expected)}\ngot      {fmt_values(got)}"
    row = index[:-1]
    where = "[" + ", ".join([str(i) for i in row] + [":"]) + "]"
    return (
        f"row {where}: expected {fmt_values(expected[row])}\n"
        f"{' ' * (len(where) + 6)}got      {fmt_values(got[row])}"
    )


def first_mistake(
    got,
    mistakes: Iterable[Mistake],
    atol: float,
    rtol: float,
    expected: torch.Tensor | None = None,
) -> str | None:
    """The description of the first known mistake whose output equals ``got``.

    A mistake that gives the right answer on these inputs (``expected``) says
    nothing and is skipped.
    """
    if not isinstance(got, torch.Tensor):
        return None
    got = got.detach().cpu()
    for description, compute in mistakes:
        try:
            candidate = compute()
        except Exception:  # noqa: BLE001 - a mistake that cannot be computed does not match
            continue
        if not isinstance(candidate, torch.Tensor):
            continue
        candidate = candidate.detach().cpu()
        if expected is not None and matches(expected, candidate, atol, rtol):
            continue
        if matches(got, candidate, atol, rtol):
            return description
    return None


def matches(got: torch.Tensor, candidate: torch.Tensor, atol: float, rtol: float) -> bool:
    """``got`` equals ``candidate`` within (atol, rtol): same shape; a bool ``candidate``
    compares with ``got != 0``; integers exactly; floats as float64, NaN equal to NaN."""
    if got.shape != candidate.shape:
        return False
    if candidate.dtype == torch.bool:
        return bool(torch.equal(got != 0, candidate))
    if got.dtype == torch.bool:
        return False
    if not (got.is_floating_point() or candidate.is_floating_point()):
        return bool(torch.equal(got, candidate))
    got = got.to(torch.float64)
    candidate = candidate.to(torch.float64)
    return bool(torch.allclose(got, candidate, atol=atol, rtol=rtol, equal_nan=True))


def _explain(message: str, got, mistakes, hints, atol, rtol, expected=None) -> str:
    mistake = first_mistake(got, mistakes, atol, rtol, expected)
    if mistake is not None:
        return message + f"\nLikely mistake: {mistake}."
    if isinstance(got, torch.Tensor):
        for hint in hints:
            try:
                text = hint(got.detach())
            except Exception:  # noqa: BLE001 - a hint that cannot be computed says nothing
                text = None
            if text:
                return message + f"\nHint: {text}."
    return message


def expect_tensor(got, name: str) -> torch.Tensor:
    if not isinstance(got, torch.Tensor):
        raise CaseFailed(f"{name}: expected a torch.Tensor, got {type(got).__name__}")
    return got


_COUNTS = {3: "three", 4: "four", 5: "five"}


def expect_tuple(got, length: int, what: str, names: Sequence[str]) -> tuple:
    """Check that ``got`` is a tuple (or list) of ``length`` items."""
    spelled = "(" + ", ".join(names) + ")"
    if not isinstance(got, (tuple, list)):
        hint = ""
        if isinstance(got, torch.Tensor):
            every = "both" if length == 2 else f"all {_COUNTS.get(length, length)}"
            hint = f": return {every}, `return {', '.join(names)}`"
        raise CaseFailed(f"{what} should return a tuple {spelled}, got {type(got).__name__}{hint}")
    if len(got) != length:
        raise CaseFailed(
            f"{what} should return {length} values {spelled}, got a {type(got).__name__} "
            f"of {len(got)}"
        )
    return tuple(got)


def expect_close(
    got,
    expected: torch.Tensor,
    name: str,
    *,
    mistakes: Iterable[Mistake] = (),
    hints: Iterable[Hint] = (),
    atol: float | None = None,
    rtol: float | None = None,
    check_dtype: bool = True,
    dtype_hint: str | None = None,
) -> torch.Tensor:
    """Fail the case unless ``got`` is a tensor equal to ``expected`` (within tolerance).

    On a mismatch the message gives expected vs got, then the first known
    mistake that reproduces ``got`` (or the first property hint that fires).
    """
    mistakes = list(mistakes)
    hints = list(hints)
    original = expect_tensor(got, name)
    expected = expected.detach().cpu()
    got = got.detach().cpu()  # the comparison happens on the CPU, whatever device came back
    default_atol, default_rtol = tolerances(expected.dtype)
    match_atol, match_rtol = match_tolerances(expected.dtype)
    if atol is not None:
        match_atol = atol
    if rtol is not None:
        match_rtol = rtol
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol

    def explain(message: str, hints) -> str:
        return _explain(message, got, mistakes, hints, match_atol, match_rtol, expected)

    if tuple(got.shape) != tuple(expected.shape):
        message = f"{name}: expected shape {fmt_shape(expected.shape)}, got {fmt_shape(got.shape)}"
        raise CaseFailed(explain(message, ()))

    if check_dtype and got.dtype != expected.dtype:
        message = f"{name}: expected dtype {expected.dtype}, got {got.dtype}"
        if matches(got, expected, match_atol, match_rtol):
            message += " (the values are right)"
            mistakes = []  # only the dtype is wrong
        if dtype_hint:
            message += f": {dtype_hint}"
        elif expected.dtype == torch.bool:
            message += " (a boolean mask: True = may attend)"
        elif expected.is_floating_point() and got.is_floating_point():
            message += (
                f": keep the input's dtype ({str(expected.dtype).replace('torch.', '')}); do "
                "not cast with `.float()`, and create new tensors with "
                "`dtype=x.dtype, device=x.device`"
            )
        raise CaseFailed(explain(message, hints))

    if expected.dtype == torch.bool or not expected.is_floating_point():
        if not torch.equal(got.detach().to(expected.dtype), expected):
            wrong = (got.detach().to(expected.dtype) != expected).nonzero()
            index = tuple(int(i) for i in wrong[0]) if len(wrong) else ()
            message = f"{name}: wrong values at {int(len(wrong))} position(s)"
            if index:
                message += "\n" + _row_excerpt(expected, got.detach().to(expected.dtype), index)
            raise CaseFailed(explain(message, hints))
        return original

    got_values = got.detach().to(expected.dtype)
    expected_finite = torch.isfinite(expected)
    bad = ~torch.isfinite(got_values) & expected_finite
    if bad.any():
        index = tuple(int(i) for i in bad.nonzero()[0])
        count = int(bad.sum())
        message = (
            f"{name}: NaN or inf at {count} of {got.numel()} positions "
            f"(first at {list(index)}) where the reference is finite"
        )
        message += "\n" + _row_excerpt(expected, got_values, index)
        raise CaseFailed(explain(message, hints))

    if not torch.allclose(got_values, expected, atol=atol, rtol=rtol, equal_nan=True):
        diff = (got_values - expected).abs().nan_to_num(nan=float("inf"))
        diff = diff.masked_fill(got_values == expected, 0)  # equal infinities are no error
        flat_index = int(diff.reshape(-1).argmax())
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat_index), diff.shape))
        message = (
            f"{name}: wrong values (largest error "
            f"{_fmt_number(float(diff.max()))} at {list(index)})\n"
            + _row_excerpt(expected, got_values, index)
        )
        hints = [*hints, _float32_precision_hint(expected)]
        raise CaseFailed(explain(message, hints))
    return original


def _float32_precision_hint(expected: torch.Tensor) -> Hint:
    """A hint for float64 results that agree with the reference only to float32 precision:
    part of the computation ran in float32 (float64 arithmetic agrees to about 1e-15)."""

    def hint(got: torch.Tensor) -> str | None:
        if expected.dtype != torch.float64 or not got.is_floating_point():
            return None
        got = got.to(torch.float64)
        if not bool(torch.isfinite(got).all()) or not bool(torch.isfinite(expected).all()):
            return None  # an error involving inf (a -inf maximum, say) is not a rounding one
        scale = 1.0 + (float(expected.abs().max()) if expected.numel() else 0.0)
        error = float((got - expected).abs().max()) / scale
        # rounding (or an epsilon) moves every entry by a small share of its own size or
        # of the tensor's: an entry off by more than 1% of both (an unclamped ramp that
        # doubles a small frequency) is a wrong value, whatever the largest error is
        own = (got - expected).abs() / (expected.abs() + 1e-4 * scale)
        if expected.numel() and float(own.max()) > 1e-2:
            return None
        if error < 1e-8:  # float32 rounding is about 6e-8 per operation
            return (
                f"your values differ from the reference by a relative {_fmt_number(error)} "
                "only: more than float64's rounding (about 1e-15), less than float32's "
                "(about 1e-7); look for a small constant that the formula does not have "
                "(an epsilon such as `+ 1e-9` in a denominator), or a constant or tensor made "
                "in float32 (`torch.tensor(eps)`, `torch.arange(n)` or `base ** ...` without "
                "`dtype=x.dtype`)"
            )
        if 5e-7 < error <= 1e-3:
            # Float32 rounding inside one of these computations stays near 1e-7 (4e-7 for
            # RoPE, 7.5e-8 for RMSNorm, 4e-8 for LayerNorm, measured); an epsilon in the
            # wrong place (outside the square root, missing, divided by N) is off by about
            # eps / var, 1.5e-6 to 5e-6 on the checkers' inputs: both are possible in this
            # band, so the hint names both.
            return (
                f"your values are close to the reference but not equal (relative error "
                f"{_fmt_number(error)}): look for a small constant in the wrong place (an "
                "epsilon outside the square root, missing, or scaled) or for work done in "
                "float32 inside (`x.float()`, a new tensor without `dtype=x.dtype`); the "
                "input is float64, so float64 arithmetic would agree to about 1e-15"
            )
        if error <= 5e-7:
            return (
                f"your values agree with the reference only to float32 precision (relative "
                f"error {_fmt_number(error)}; float64 arithmetic agrees to about 1e-15): the "
                "input is float64 but the work was computed in float32 inside (`x.float()` "
                "... `.to(x.dtype)`, `torch.tensor(...)` or a new tensor without "
                "`dtype=x.dtype`, or float32's constants such as its epsilon "
                "`torch.finfo(torch.float32).eps`); keep the input's dtype (float64) throughout"
            )
        return None

    return hint


def expect_like(got, like: torch.Tensor, name: str) -> torch.Tensor:
    """Fail unless ``got`` is a tensor of ``like``'s shape with no NaN or inf where ``like``
    is finite; its values are checked elsewhere (e.g. by their dropout properties)."""
    return expect_close(got, like, name, check_dtype=False, atol=float("inf"), rtol=0.0)


def expect_meta_mask(got, shape: tuple[int, int], moved: Callable[[str], str]) -> None:
    """A mask asked for on the meta device: a bool tensor of ``shape`` that is still there;
    ``moved(device type)`` says what went wrong when it came back elsewhere."""
    if not isinstance(got, torch.Tensor):
        raise CaseFailed(f"the mask: expected a torch.Tensor, got {type(got).__name__}")
    if got.device != torch.device("meta"):
        raise CaseFailed(moved(got.device.type))
    if tuple(got.shape) != shape or got.dtype != torch.bool:
        raise CaseFailed(
            f"the mask on the meta device: expected a bool {shape} tensor, got "
            f"{got.dtype} {tuple(got.shape)}"
        )


def expect_grad(got_grad, expected_grad, name: str, *, mistakes=(), atol=None, rtol=None):
    """Fail unless a gradient reached ``name`` and equals the reference's."""
    if expected_grad is None:
        return
    if got_grad is None:
        raise CaseFailed(
            f"no gradient reached {name}: every input and parameter must be used through "
            "differentiable tensor operations (no `.detach()`, `.data`, `.item()`, "
            "`.numpy()` or `torch.tensor(...)` rebuilt from values)"
        )
    if tuple(got_grad.shape) != tuple(expected_grad.shape):
        raise CaseFailed(
            f"the gradient of {name} has shape {fmt_shape(got_grad.shape)}, "
            f"expected {fmt_shape(expected_grad.shape)}"
        )
    expect_close(
        got_grad,
        expected_grad,
        f"the gradient of {name}",
        mistakes=mistakes,
        atol=atol,
        rtol=rtol,
        check_dtype=False,
    )


# ---------------------------------------------------------------- property hints


def sums_to_one_hint(dim: int, axis_name: str, *, masked: bool = True) -> Hint:
    """A hint that fires when weights do not sum to 1 over ``dim`` but do over another axis.
    ``masked``: the target takes a mask, so an all-zero row (a fully masked query) is fine;
    without masks (soft_argmax, set attention) every row must sum to 1 and the hint does
    not talk about masks."""

    def ones_ok(got: torch.Tensor, d: int) -> bool:
        """Every row along ``d`` sums to 1 (except all-zero rows, when ``masked``)."""
        sums = got.sum(d)
        empty = (got == 0).all(d) if masked else torch.zeros_like(sums, dtype=torch.bool)
        return bool(torch.allclose(sums[~empty], torch.ones((), dtype=got.dtype), atol=1e-6))

    def hint(got: torch.Tensor) -> str | None:
        if not got.is_floating_point() or got.dim() == 0:
            return None
        if bool((got == 0).all()):
            if masked:
                return "all your weights are 0: only a fully masked query row has zero weights"
            return (
                f"all your weights are 0: they must be positive and sum to 1 over {axis_name} "
                "(exponentials divided by their sum)"
            )
        if ones_ok(got, dim):
            return None
        for other in range(-got.dim(), 0):
            if other != (dim if dim < 0 else dim - got.dim()) and ones_ok(got, other):
                return (
                    f"your weights sum to 1 over dim={other}, but they must sum to 1 over "
                    f"{axis_name} (dim={dim})"
                )
        if got.min() < 0:
            return "some weights are negative: weights come out of a softmax"
        sums = got.sum(dim)
        example = f"{_fmt_number(float(sums.reshape(-1)[0]))}"
        if masked:
            return (
                f"your weights do not sum to 1 over {axis_name} (dim={dim}) (rows that are all "
                "zero, for fully masked queries, are fine)"
            )
        return (
            f"your weights do not sum to 1 over {axis_name} (dim={dim}): the first row sums "
            f"to {example}; divide the exponentials by their own sum over {axis_name}, with "
            "the same max subtracted in the numerator and the denominator"
        )

    return hint


def name_from_probe(
    failure: CaseFailed,
    probe: Callable[[], object],
    mistakes: Iterable[Mistake],
    expected: torch.Tensor,
    shown: str,
    fallback: str | None = None,
) -> CaseFailed:
    """A small case can fit several known mistakes at once (at size 1 an inverted causal
    mask and one without its diagonal both give ``[[False]]``), so its message names none
    or the wrong one. ``probe()`` calls the student's code on a larger input, ``shown``
    (e.g. ``"causal_mask(6)"``), whose right answer is ``expected``: the mistake named is
    the one that reproduces the probe's output. Without one, ``fallback`` is added as a
    hint. Returns the case's failure, its first lines kept."""
    head = "\n".join(
        line
        for line in str(failure).splitlines()
        if not line.startswith(("Likely mistake:", "Hint:"))
    )
    try:
        got = probe()
    except Exception:  # noqa: BLE001 - the case's own message stands
        got = None
    if isinstance(got, torch.Tensor) and not matches(got.detach().cpu(), expected, 0.0, 0.0):
        mistake = first_mistake(got, mistakes, 0.0, 0.0, expected)
        if mistake is not None:
            return CaseFailed(f"{head}\nLikely mistake (the same code on {shown}): {mistake}.")
    if fallback and "\nLikely mistake:" not in str(failure) and "\nHint:" not in str(failure):
        return CaseFailed(f"{head}\nHint: {fallback}.")
    return failure


def unambiguous(mistakes, expected: torch.Tensor):
    """The known mistakes that a wrong output names without doubt: a mistake is dropped
    when it gives the right answer on this input, or when another mistake with a different
    description gives the same output (at Hkv = 2, n_rep = 3 "Hkv copies" and "n_rep - 1
    copies" are the same tensor, and naming either would be a guess)."""
    outputs = []
    for description, compute in mistakes:
        try:
            out = compute()
        except Exception:  # noqa: BLE001 - a mistake that cannot be computed does not match
            continue
        if isinstance(out, torch.Tensor):
            out = out.detach().cpu()
            if out.shape == expected.shape and matches(expected, out, 0.0, 0.0):
                continue
            outputs.append((description, out))
    kept = []
    for description, out in outputs:
        if any(
            other_description != description
            and other.shape == out.shape
            and matches(out, other, 0.0, 0.0)
            for other_description, other in outputs
        ):
            continue
        kept.append((description, lambda out=out: out))
    return kept
