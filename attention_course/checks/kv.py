"""Checkers for chapter 15's cheaper keys and values: ``repeat_kv(x, n_rep)`` (grouped
key/value heads shared by neighbouring query heads) and ``sliding_window_mask(size,
window, device=None)`` (each token sees itself and the ``window - 1`` tokens before it)."""

from __future__ import annotations

import torch

from attention_course import kv as ref

from ._compare import (
    expect_close,
    expect_meta_mask,
    fmt_shape,
    name_from_probe,
    unambiguous,
)
from ._data import leaf, randn
from ._modules import expect_same_grads
from ._runner import TRIVIAL, Case, CaseFailed, call_student, checker, expect_value_error

# ---------------------------------------------------------------- repeat_kv: known mistakes

REPEAT_TILED = (
    "your copies are tiled, not interleaved (`x.repeat(1, n_rep, 1, 1)`, or an expand to "
    "(B, n_rep, Hkv, S, Dh)): output head h gets key/value head h % Hkv, so query heads "
    "0 and Hkv share a head instead of the neighbours 0 .. n_rep - 1; output head h must be "
    "input head h // n_rep: `torch.repeat_interleave(x, n_rep, dim=1)`, or expand to "
    "(B, Hkv, n_rep, S, Dh) and reshape"
)
REPEAT_POSITIONS = (
    "you repeated along the positions (dim=2), not the heads: each key appears n_rep times "
    "in a row and the head count is unchanged; repeat along dim=1, the head axis of "
    "(B, Hkv, S, Dh)"
)
REPEAT_BATCH = (
    "you repeated along the batch (dim=0), not the heads: repeat along dim=1, the head axis "
    "of (B, Hkv, S, Dh)"
)
REPEAT_FEATURES = (
    "you repeated along the features (dim=-1), not the heads: each head gets n_rep · Dh "
    "features; repeat along dim=1, the head axis of (B, Hkv, S, Dh)"
)
REPEAT_SWAPPED = (
    "you repeated each head Hkv times instead of n_rep times (the two numbers swapped): "
    "the output has Hkv · n_rep heads, each key/value head copied n_rep times"
)
REPEAT_ONE_SHORT = (
    "each key/value head appears n_rep - 1 times, one copy too few (`repeat_interleave` "
    "takes the number of copies in the output, n_rep, not the number of extra copies)"
)
REPEAT_POSITIONS_RESHAPED = (
    "the copies were made along the positions (dim=2, or an expand after the position "
    "axis) and then reshaped into heads, so each output head holds a mix of positions; "
    "copy along dim=1, the head axis: `torch.repeat_interleave(x, n_rep, dim=1)`"
)
REPEAT_FEATURES_RESHAPED = (
    "each feature is repeated n_rep times (copies along dim=3, the features) and then "
    "reshaped into heads; copy along dim=1, the head axis: "
    "`torch.repeat_interleave(x, n_rep, dim=1)`"
)
REPEAT_FIRST_BATCH = (
    "batch element 0 is right but the others are copies of it: do not index or expand "
    "the batch axis; keep every batch element and copy only along dim=1"
)
REPEAT_DIV_HKV = (
    "output head h got input head h // Hkv: divide by n_rep, the size of a group, not by "
    "Hkv, the number of groups (output head h is input head h // n_rep)"
)
REPEAT_AVERAGED = (
    "every value is the expected one divided by n_rep: copy the heads, do not average them"
)


def _repeat_mistakes(x: torch.Tensor, n_rep: int):
    x = x.detach()
    B, Hkv, S, Dh = x.shape
    H = Hkv * n_rep
    return [
        (REPEAT_TILED, lambda: x.repeat(1, n_rep, 1, 1)),
        (REPEAT_POSITIONS, lambda: torch.repeat_interleave(x, n_rep, dim=2)),
        (REPEAT_POSITIONS, lambda: x.repeat(1, 1, n_rep, 1)),
        (REPEAT_BATCH, lambda: torch.repeat_interleave(x, n_rep, dim=0)),
        (REPEAT_BATCH, lambda: x.repeat(n_rep, 1, 1, 1)),
        (REPEAT_FEATURES, lambda: torch.repeat_interleave(x, n_rep, dim=-1)),
        (REPEAT_FEATURES, lambda: x.repeat(1, 1, 1, n_rep)),
        (REPEAT_SWAPPED, lambda: torch.repeat_interleave(x, Hkv, dim=1)),
        (REPEAT_ONE_SHORT, lambda: torch.repeat_interleave(x, n_rep - 1, dim=1)),
        (
            REPEAT_POSITIONS_RESHAPED,
            lambda: torch.repeat_interleave(x, n_rep, dim=2).reshape(B, H, S, Dh),
        ),
        (
            REPEAT_FEATURES_RESHAPED,
            lambda: torch.repeat_interleave(x, n_rep, dim=3).reshape(B, H, S, Dh),
        ),
        (
            REPEAT_FIRST_BATCH,
            lambda: torch.repeat_interleave(x[:1], n_rep, dim=1).expand(B, H, S, Dh),
        ),
        (REPEAT_AVERAGED, lambda: torch.repeat_interleave(x, n_rep, dim=1) / n_rep),
        (REPEAT_DIV_HKV, lambda: x[:, torch.arange(H) // Hkv]),
    ]


def _index_hint(text: str) -> str | None:
    if "out of bounds" in text or "out of range" in text:
        return (
            "an index past the last key/value head: output head h is input head h // n_rep "
            "(always < Hkv); dividing by Hkv instead of n_rep overshoots"
        )
    return None


def _repeat_what(x: torch.Tensor, n_rep: int) -> str:
    dtype = str(x.dtype).replace("torch.", "")
    return f"repeat_kv(x {tuple(x.shape)} {dtype}, n_rep={n_rep})"


def _expect_repeat(got, expected: torch.Tensor, x: torch.Tensor, n_rep: int, name: str):
    """``expect_close`` with the head count spelled out when it is wrong."""
    mistakes = unambiguous(_repeat_mistakes(x, n_rep), expected)
    Hkv = x.shape[1]
    if (
        isinstance(got, torch.Tensor)
        and got.dim() == 4
        and tuple(got.shape) != tuple(expected.shape)
        and got.shape[1] != expected.shape[1]
    ):
        message = (
            f"{name}: expected shape {fmt_shape(expected.shape)}, got {fmt_shape(got.shape)}: "
            f"expected Hkv · n_rep = {Hkv} · {n_rep} = {Hkv * n_rep} heads, got "
            f"{got.shape[1]}; "
            + ("the key/value head" if Hkv == 1 else f"each of the {Hkv} key/value heads")
            + f" must appear n_rep = {n_rep} times"
        )
        try:
            expect_close(got, expected, name, mistakes=mistakes)
        except CaseFailed as error:
            text = str(error)
            if "\nLikely mistake:" in text:
                message += text[text.index("\nLikely mistake:") :]
        raise CaseFailed(message)
    expect_close(got, expected, name, mistakes=mistakes)


def _repeat_case(
    candidate,
    shape: tuple[int, int, int, int],
    n_rep: int,
    *,
    seed: int,
    dtype=torch.float64,
    grad: bool = False,
):
    def run():
        x = randn(*shape, seed=seed, dtype=dtype)
        mine, theirs = (leaf(x), leaf(x)) if grad else (x.clone(), x.clone())
        expected = ref.repeat_kv(theirs, n_rep)
        got = call_student(
            candidate,
            mine,
            n_rep,
            what=_repeat_what(x, n_rep),
            arg_names=("x",),
            error_hint=_index_hint,
        )
        _expect_repeat(got, expected, x, n_rep, f"the output of {_repeat_what(x, n_rep)}")
        if grad:
            # n_rep = 1 may return x itself, but the gradient must still reach x.
            expect_same_grads(got, expected, {"x": (mine, theirs)})

    return run


def _repeat_grad_case(candidate):
    def run():
        x = randn(2, 2, 3, 4, seed=21)
        mine, theirs = leaf(x), leaf(x)
        expected = ref.repeat_kv(theirs, 3)
        got = call_student(candidate, mine, 3, what=_repeat_what(x, 3), arg_names=("x",))
        _expect_repeat(got, expected, x, 3, "the output")
        # Each key/value head's gradient is the sum over the n_rep query heads that share it.
        expect_same_grads(got, expected, {"x": (mine, theirs)})

    return run


@checker("repeat_kv")
def check_repeat_kv(candidate) -> list[Case]:
    """Check ``repeat_kv(x (B, Hkv, S, Dh), n_rep) -> (B, Hkv·n_rep, S, Dh)``: output head
    ``h`` is input head ``h // n_rep`` (as ``torch.repeat_interleave(x, n_rep, dim=1)``)."""
    return [
        Case(
            "B=2, Hkv=2, S=5, Dh=3, n_rep=3: neighbouring query heads share a head",
            _repeat_case(candidate, (2, 2, 5, 3), 3, seed=1),
            covers=frozenset({"B>1", "Hkv>1"}),
        ),
        Case(
            "Hkv=3, n_rep=2, S=4, Dh=6",
            _repeat_case(candidate, (1, 3, 4, 6), 2, seed=2),
            covers=frozenset({"Hkv>1"}),
        ),
        Case(
            "Hkv=1, n_rep=4: multi-query attention, one head copied to all",
            _repeat_case(candidate, (2, 1, 5, 2), 4, seed=3),
            covers=frozenset({"Hkv=1", "B>1"}),
        ),
        Case(
            "n_rep=1: the heads unchanged, and the gradient still reaches x",
            _repeat_case(candidate, (2, 4, 3, 2), 1, seed=4, grad=True),
            covers=frozenset({"n_rep=1", "n_rep=1 x grad", "grad"}),
            support=True,
        ),
        Case(
            "S=1 (one cached position), Hkv=2, n_rep=2",
            _repeat_case(candidate, (3, 2, 1, 4), 2, seed=5),
            covers=frozenset({"S=1", "Hkv>1", "B>1"}),
        ),
        Case(
            "float32 input: the result keeps float32",
            _repeat_case(candidate, (2, 2, 3, 5), 2, seed=6, dtype=torch.float32),
            covers=frozenset({"dtype=float32", "Hkv>1"}),
        ),
        Case(
            "gradients: each key/value head gets the sum over its n_rep copies",
            _repeat_grad_case(candidate),
            covers=frozenset({"grad"}),
        ),
    ]


# ---------------------------------------------------------------- sliding_window_mask

WINDOW_TOO_WIDE = (
    "your window is one too wide (off by one): token i sees window + 1 tokens, i - window .. "
    "i; keep j when 0 <= i - j < window (strictly less: itself and the window - 1 before it)"
)
WINDOW_TOO_NARROW = (
    "your window is one too narrow (off by one): token i sees only window - 1 tokens; keep j "
    "when 0 <= i - j < window, i.e. itself and the window - 1 tokens before it"
)
WINDOW_CAPPED = (
    "your window is capped at size - 1 (`min(window, size - 1)`): a window as long as the "
    "sequence or longer keeps every earlier token, the plain causal mask; do not cap it "
    "(or cap it at size)"
)
WINDOW_NARROW_OR_CAPPED = (
    "token i sees at most size - 1 tokens: either your window is one too narrow (0 <= i - j "
    "< window - 1), or it is capped at size - 1 (`min(window, size - 1)`); keep j when "
    "0 <= i - j < window, so a window of size or more is the plain causal mask"
)
WINDOW_NOT_CAUSAL = (
    "your window is not causal: it is a band on both sides of the diagonal (|i - j| < "
    "window), so token i sees the next window - 1 tokens too; keep only j <= i "
    "(intersect with the causal mask: `tril`)"
)
WINDOW_FUTURE = (
    "your window looks forward, not back (0 <= j - i < window, i.e. transposed): token i "
    "must see itself and the tokens *before* it"
)
WINDOW_IGNORED = (
    "your mask is the plain causal mask: the window is ignored; also hide the keys j with "
    "i - j >= window (`.triu(diagonal=-(window - 1))`)"
)
WINDOW_INVERTED = (
    "your mask is inverted: True must mean 'may attend' (inside the window), False the "
    "positions to hide"
)
WINDOW_NO_DIAGONAL = (
    "your window leaves out the diagonal: a token must see itself; keep j when 0 <= i - j < "
    "window (i - j = 0 included)"
)
WINDOW_SHIFTED = (
    "your band is shifted one step back, 0 < i - j <= window: the diagonal is False (a "
    "token must see itself, i - j = 0) and the key i - window, one too far back, is True; "
    "keep j when 0 <= i - j < window"
)
WINDOW_MODULO = (
    "your mask compares slots (positions mod window), as the rolling cache stores them; "
    "the mask is about positions: True where 0 <= i - j < window, no modulo"
)
WINDOW_ADDITIVE = (
    "you returned an additive float mask (0 where a token may attend, -inf elsewhere); "
    "this function returns a bool mask, True = may attend (the pattern itself is right)"
)


def _window_mistakes(size: int, window: int):
    i = torch.arange(size).reshape(size, 1)
    j = torch.arange(size).reshape(1, size)
    d = i - j  # how far back key j is from query i
    # at window == size a window one too narrow and one capped at size - 1 are one mask
    narrow = WINDOW_NARROW_OR_CAPPED if window == size else WINDOW_TOO_NARROW
    capped = WINDOW_NARROW_OR_CAPPED if window == size else WINDOW_CAPPED
    return [
        (WINDOW_TOO_WIDE, lambda: (d >= 0) & (d <= window)),
        (narrow, lambda: (d >= 0) & (d < window - 1)),
        (capped, lambda: (d >= 0) & (d < min(window, size - 1))),
        (WINDOW_NOT_CAUSAL, lambda: d.abs() < window),
        (WINDOW_NOT_CAUSAL, lambda: d.abs() <= window),
        (WINDOW_FUTURE, lambda: (d <= 0) & (d > -window)),
        (WINDOW_IGNORED, lambda: d >= 0),
        (WINDOW_INVERTED, lambda: ~((d >= 0) & (d < window))),
        (WINDOW_SHIFTED, lambda: (d > 0) & (d <= window)),
        (WINDOW_NO_DIAGONAL, lambda: (d > 0) & (d < window)),
        (WINDOW_MODULO, lambda: (d >= 0) & (i % window >= j % window)),
        (WINDOW_MODULO, lambda: i % window >= j % window),
    ]


def _device_hint(text: str) -> str | None:
    if "device" in text:
        return "create every tensor (both `arange`s, any `ones`) on `device`"
    return None


_PROBE = (8, 3)  # (size, window) of the larger mask that names an ambiguous mistake


def _window_case(candidate, size: int, window: int, with_device: bool = False):
    def run():
        expected = ref.sliding_window_mask(size, window)
        kwargs = {"device": torch.device("cpu")} if with_device else {}
        extra = ", device=torch.device('cpu')" if with_device else ""
        what = f"sliding_window_mask({size}, window={window}{extra})"
        got = call_student(candidate, size, window, what=what, error_hint=_device_hint, **kwargs)
        if (
            isinstance(got, torch.Tensor)
            and got.is_floating_point()
            and tuple(got.shape) == tuple(expected.shape)
            and bool(((got == 0) | (got == float("-inf"))).all())
            and bool((got == float("-inf")).any())
            and torch.equal((got == 0).cpu(), expected)
        ):
            raise CaseFailed(
                f"the mask of {what}: expected dtype torch.bool, got {got.dtype}\n"
                f"Likely mistake: {WINDOW_ADDITIVE}."
            )
        # A mistake is named only where it alone explains the output: at size 1 an inverted
        # mask, a window one too narrow and a missing diagonal all give [[False]].
        mistakes = unambiguous(_window_mistakes(size, window), expected)
        try:
            expect_close(got, expected, f"the mask of {what}", mistakes=mistakes)
        except CaseFailed as failure:
            if "\nLikely mistake:" in str(failure):
                raise
            # The same code on a larger mask tells the mistakes apart.
            size_, window_ = _PROBE
            shown = f"sliding_window_mask({size_}, window={window_})"
            raise name_from_probe(
                failure,
                lambda: call_student(candidate, size_, window_, what=shown),
                unambiguous(
                    _window_mistakes(size_, window_), ref.sliding_window_mask(size_, window_)
                ),
                ref.sliding_window_mask(size_, window_),
                shown,
                fallback=(
                    "row i must be True exactly at the keys j with 0 <= i - j < window: "
                    + (
                        "here (window 1) token i itself only"
                        if window == 1
                        else f"token i itself and the window - 1 = {window - 1} before it"
                    )
                    + ", never a later one"
                ),
            ) from None
        if with_device and got.device != torch.device("cpu"):
            raise CaseFailed(f"the mask is on {got.device}, expected the requested device cpu")

    return run


def _window_meta_case(candidate, size: int, window: int):
    """The `device` argument on PyTorch's "meta" device: a mask built elsewhere shows."""

    def run():
        meta = torch.device("meta")
        what = f"sliding_window_mask({size}, {window}, device=torch.device('meta'))"
        got = call_student(candidate, size, window, device=meta, what=what, error_hint=_device_hint)
        expect_meta_mask(
            got,
            (size, size),
            lambda device: (
                f"the `device` argument is ignored: {what} returned a mask on {device}; "
                "create the tensor on the requested device, `torch.ones(size, size, "
                "dtype=torch.bool, device=device)`"
            ),
        )

    return run


def _bad_window_case(candidate):
    """``window < 1`` must raise ValueError naming ``window``."""

    def run():
        for window in (0, -2):
            expect_value_error(
                lambda window=window: candidate(5, window),
                f"sliding_window_mask(5, window={window})",
                "window",
                example="window: got {window!r}, expected an int >= 1",
                other_error="check `window` at the top of the function and raise ValueError.",
                returned=f"a window of {window} lets a token see nothing, not even itself; "
                "raise ValueError naming `window` unless window >= 1",
            )

    return run


@checker("sliding_window_mask")
def check_sliding_window_mask(candidate) -> list[Case]:
    """Check ``sliding_window_mask(size, window, device=None) -> bool (size, size)``: True
    where ``0 <= i - j < window``."""
    return [
        Case("size 1, window 1", _window_case(candidate, 1, 1), weight=TRIVIAL, support=True),
        Case("size 6, window 3", _window_case(candidate, 6, 3)),
        Case("size 7, window 2", _window_case(candidate, 7, 2)),
        Case(
            "size 5, window 1: each token sees only itself",
            _window_case(candidate, 5, 1),
            covers=frozenset({"window=1"}),
            support=True,
        ),
        Case(
            "size 5, window 5: the causal mask",
            _window_case(candidate, 5, 5),
            covers=frozenset({"window>=size"}),
            support=True,
        ),
        Case(
            "size 4, window 9 (wider than the sequence): the causal mask",
            _window_case(candidate, 4, 9),
            covers=frozenset({"window>=size"}),
            support=True,
        ),
        Case(
            "device='cpu' given explicitly",
            _window_case(candidate, 6, 4, with_device=True),
            covers=frozenset({"device"}),
        ),
        Case(
            "device argument on the 'meta' device",
            _window_meta_case(candidate, 6, 3),
            covers=frozenset({"device", "device=meta"}),
            support=True,
        ),
        Case(
            "window < 1 raises ValueError naming window",
            _bad_window_case(candidate),
            covers=frozenset({"bad window"}),
            support=True,
        ),
    ]
