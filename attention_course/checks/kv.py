"""Checkers for chapter 15's cheaper keys and values: ``repeat_kv(x, n_rep)`` (grouped
key/value heads shared by neighbouring query heads) and ``sliding_window_mask(size,
window, device=None)`` (each token sees itself and the ``window - 1`` tokens before it)."""

from __future__ import annotations

import torch

from attention_course import kv as ref

from ._compare import expect_close
from ._data import leaf, randn
from ._modules import expect_same_grads
from ._runner import (
    TRIVIAL,
    Case,
    CaseFailed,
    NotImplementedYet,
    call_student,
    checker,
    describe_exception,
)
from .masking import _expect_meta_mask

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


def _repeat_mistakes(x: torch.Tensor, n_rep: int):
    x = x.detach()
    Hkv = x.shape[1]
    return [
        (REPEAT_TILED, lambda: x.repeat(1, n_rep, 1, 1)),
        (REPEAT_POSITIONS, lambda: torch.repeat_interleave(x, n_rep, dim=2)),
        (REPEAT_POSITIONS, lambda: x.repeat(1, 1, n_rep, 1)),
        (REPEAT_BATCH, lambda: torch.repeat_interleave(x, n_rep, dim=0)),
        (REPEAT_BATCH, lambda: x.repeat(n_rep, 1, 1, 1)),
        (REPEAT_FEATURES, lambda: torch.repeat_interleave(x, n_rep, dim=-1)),
        (REPEAT_FEATURES, lambda: x.repeat(1, 1, 1, n_rep)),
        (REPEAT_SWAPPED, lambda: torch.repeat_interleave(x, Hkv, dim=1)),
    ]


def _repeat_what(x: torch.Tensor, n_rep: int) -> str:
    dtype = str(x.dtype).replace("torch.", "")
    return f"repeat_kv(x {tuple(x.shape)} {dtype}, n_rep={n_rep})"


def _repeat_case(
    candidate, shape: tuple[int, int, int, int], n_rep: int, *, seed: int, dtype=torch.float64
):
    def run():
        x = randn(*shape, seed=seed, dtype=dtype)
        expected = ref.repeat_kv(x.clone(), n_rep)
        got = call_student(candidate, x, n_rep, what=_repeat_what(x, n_rep), arg_names=("x",))
        expect_close(
            got,
            expected,
            f"the output of {_repeat_what(x, n_rep)}",
            mistakes=_repeat_mistakes(x, n_rep),
        )

    return run


def _repeat_grad_case(candidate):
    def run():
        x = randn(2, 2, 3, 4, seed=21)
        mine, theirs = leaf(x), leaf(x)
        expected = ref.repeat_kv(theirs, 3)
        got = call_student(candidate, mine, 3, what=_repeat_what(x, 3), arg_names=("x",))
        expect_close(got, expected, "the output", mistakes=_repeat_mistakes(x, 3))
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
            "n_rep=1: the heads unchanged",
            _repeat_case(candidate, (2, 4, 3, 2), 1, seed=4),
            weight=TRIVIAL,
            covers=frozenset({"n_rep=1"}),
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


def _window_mistakes(size: int, window: int):
    i = torch.arange(size).reshape(size, 1)
    j = torch.arange(size).reshape(1, size)
    d = i - j  # how far back key j is from query i
    return [
        (WINDOW_TOO_WIDE, lambda: (d >= 0) & (d <= window)),
        (WINDOW_TOO_NARROW, lambda: (d >= 0) & (d < window - 1)),
        (WINDOW_NOT_CAUSAL, lambda: d.abs() < window),
        (WINDOW_NOT_CAUSAL, lambda: d.abs() <= window),
        (WINDOW_FUTURE, lambda: (d <= 0) & (d > -window)),
        (WINDOW_IGNORED, lambda: d >= 0),
        (WINDOW_INVERTED, lambda: ~((d >= 0) & (d < window))),
        (WINDOW_NO_DIAGONAL, lambda: (d > 0) & (d <= window)),
        (WINDOW_NO_DIAGONAL, lambda: (d > 0) & (d < window)),
    ]


def _window_case(candidate, size: int, window: int, with_device: bool = False):
    def run():
        expected = ref.sliding_window_mask(size, window)
        kwargs = {"device": torch.device("cpu")} if with_device else {}
        extra = ", device=torch.device('cpu')" if with_device else ""
        what = f"sliding_window_mask({size}, window={window}{extra})"
        got = call_student(candidate, size, window, what=what, **kwargs)
        expect_close(got, expected, f"the mask of {what}", mistakes=_window_mistakes(size, window))
        if with_device and got.device != torch.device("cpu"):
            raise CaseFailed(f"the mask is on {got.device}, expected the requested device cpu")

    return run


def _window_meta_case(candidate, size: int, window: int):
    """The `device` argument on PyTorch's "meta" device: a mask built elsewhere shows."""

    def run():
        meta = torch.device("meta")
        what = f"sliding_window_mask({size}, {window}, device=torch.device('meta'))"
        got = call_student(candidate, size, window, device=meta, what=what)
        _expect_meta_mask(
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
            what = f"sliding_window_mask(5, window={window})"
            try:
                candidate(5, window)
            except ValueError as error:
                if "window" not in str(error):
                    raise CaseFailed(
                        f"{what} raised ValueError({str(error)!r}): good, but the message "
                        "should name the argument, e.g. ValueError(f'window: got {window!r}, "
                        "expected an int >= 1')"
                    ) from None
                continue
            except NotImplementedError as error:
                raise NotImplementedYet(str(error)) from None
            except Exception as error:  # noqa: BLE001 - any other exception is a failed case
                raise CaseFailed(
                    describe_exception(error, what)
                    + "\nHint: check `window` at the top of the function and raise ValueError."
                ) from None
            raise CaseFailed(
                f"{what} returned without raising: a window of {window} lets a token see "
                "nothing, not even itself; raise ValueError naming `window` unless window >= 1"
            )

    return run


@checker("sliding_window_mask")
def check_sliding_window_mask(candidate) -> list[Case]:
    """Check ``sliding_window_mask(size, window, device=None) -> bool (size, size)``: True
    where ``0 <= i - j < window``."""
    return [
        Case("size 1, window 1", _window_case(candidate, 1, 1), weight=TRIVIAL),
        Case("size 6, window 3", _window_case(candidate, 6, 3)),
        Case("size 7, window 2", _window_case(candidate, 7, 2)),
        Case(
            "size 5, window 1: each token sees only itself",
            _window_case(candidate, 5, 1),
            covers=frozenset({"window=1"}),
        ),
        Case(
            "size 5, window 5: the causal mask",
            _window_case(candidate, 5, 5),
            covers=frozenset({"window>=size"}),
        ),
        Case(
            "size 4, window 9 (wider than the sequence): the causal mask",
            _window_case(candidate, 4, 9),
            covers=frozenset({"window>=size"}),
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
        ),
        Case(
            "window < 1 raises ValueError naming window",
            _bad_window_case(candidate),
            covers=frozenset({"bad window"}),
        ),
    ]
