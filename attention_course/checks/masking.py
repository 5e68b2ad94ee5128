"""Checkers for the masks: ``causal_mask`` and ``padding_mask`` (True = may attend)."""

from __future__ import annotations

import torch

from attention_course import masking as ref

from ._compare import expect_close, expect_meta_mask, name_from_probe, unambiguous
from ._runner import TRIVIAL, Case, CaseFailed, call_student, checker

_BOOL_HINT = "build it with `dtype=torch.bool` (or compare with `<`/`<=`, which gives bools)"


def _causal_mistakes(size: int):
    ones = torch.ones(size, size, dtype=torch.bool)
    return [
        (
            "the mask is all True: nothing is masked, so every token sees the whole "
            "sequence, the future included; keep True only on and below the diagonal, "
            "`torch.ones(size, size, dtype=torch.bool).tril()`",
            lambda: ones.clone(),
        ),
        (
            "the diagonal is excluded (off by one): a token may attend to itself, so use "
            "`torch.tril(...)` with diagonal=0",
            lambda: ones.tril(-1),
        ),
        (
            "the mask includes one future position (off by one): use diagonal=0, not 1",
            lambda: ones.tril(1),
        ),
        (
            "the mask is inverted (True on the future): True must mean 'may attend', i.e. "
            "on and below the diagonal",
            lambda: ~ones.tril(),
        ),
        (
            "the mask is transposed (True on and above the diagonal): that lets every token see "
            "the future; use `torch.tril`, not `torch.triu`",
            lambda: ones.triu(),
        ),
    ]


def _causal_case(candidate, size: int, with_device: bool = False):
    def run():
        expected = ref.causal_mask(size)
        kwargs = {"device": torch.device("cpu")} if with_device else {}
        what = f"causal_mask({size}" + (", device=torch.device('cpu'))" if with_device else ")")
        got = call_student(candidate, size, what=what, **kwargs)
        mistakes = _causal_mistakes(size)
        if (
            isinstance(got, torch.Tensor)
            and got.is_floating_point()
            and got.shape == expected.shape
            and torch.equal(got.detach().cpu() == 0, expected)
            and bool(torch.isneginf(got.detach().cpu()[~expected]).all())
        ):
            raise CaseFailed(
                "this is an additive float mask (0 where allowed, -inf on the future): this task "
                "wants a bool mask, True = may attend, e.g. "
                "`torch.ones(size, size, dtype=torch.bool, device=device).tril()`"
            )
        if (
            isinstance(got, torch.Tensor)
            and got.dtype != torch.bool
            and got.shape == expected.shape
        ):
            # Name the logic mistake too when the dtype is also wrong.
            try:
                bool_got = got.detach().bool()
            except Exception:  # noqa: BLE001
                bool_got = None
            if bool_got is not None and torch.equal(bool_got, expected):
                raise CaseFailed(
                    f"the mask has dtype {got.dtype}, expected torch.bool (True = may attend): "
                    f"{_BOOL_HINT}"
                )
        try:
            expect_close(got, expected, "the mask", mistakes=unambiguous(mistakes, expected))
        except CaseFailed as failure:
            if "\nLikely mistake:" in str(failure):
                raise
            # At size 1 an inverted mask and a mask without its diagonal are both [[False]]:
            # the same code on a larger size tells them apart.
            raise name_from_probe(
                failure,
                lambda: call_student(candidate, _PROBE_SIZE, what=f"causal_mask({_PROBE_SIZE})"),
                _causal_mistakes(_PROBE_SIZE),
                ref.causal_mask(_PROBE_SIZE),
                f"causal_mask({_PROBE_SIZE})",
            ) from None
        if with_device and got.device != torch.device("cpu"):
            raise CaseFailed(f"the mask is on {got.device}, expected the requested device cpu")

    return run


_PROBE_SIZE = 6


def _causal_meta_case(candidate, size: int):
    """The `device` argument, on PyTorch's "meta" device: it exists on every machine and
    holds no data, so a mask built on the CPU (device ignored) shows at once."""

    def run():
        meta = torch.device("meta")
        got = call_student(
            candidate, size, device=meta, what=f"causal_mask({size}, device=torch.device('meta'))"
        )
        expect_meta_mask(
            got,
            (size, size),
            lambda device: (
                f"the `device` argument is ignored: causal_mask({size}, device=meta) returned a "
                f"mask on {device}, expected it on the requested device (meta); create "
                "the tensor there, `torch.ones(size, size, dtype=torch.bool, device=device)`, "
                "instead of moving it afterwards or ignoring `device`"
            ),
        )

    return run


@checker(
    "causal_mask",
    # the statement does not forbid it: a note for the instructor, not a zero
    answer_builtins=("torch.nn.Transformer.generate_square_subsequent_mask",),
    forbid=False,
)
def check_causal_mask(candidate) -> list[Case]:
    """Check ``causal_mask(size, device=None) -> bool (size, size)``, True on and below
    the diagonal."""
    return [
        Case("size 1", _causal_case(candidate, 1), weight=TRIVIAL, support=True),
        Case("size 2", _causal_case(candidate, 2), weight=TRIVIAL),
        Case("size 5", _causal_case(candidate, 5)),
        Case("size 8", _causal_case(candidate, 8)),
        Case(
            "device='cpu' given explicitly",
            _causal_case(candidate, 4, with_device=True),
            covers=frozenset({"device"}),
        ),
        Case(
            "device argument on the 'meta' device",
            _causal_meta_case(candidate, 6),
            covers=frozenset({"device", "device=meta"}),
            support=True,
        ),
    ]


def _padding_mistakes(lengths: torch.Tensor, max_len: int | None):
    S = int(lengths.max()) if max_len is None else max_len
    positions = torch.arange(S)
    return [
        (
            "the mask is inverted (True at the padding): True must mark the real tokens, "
            "position s is real when s < length",
            lambda: positions[None, :] >= lengths[:, None],
        ),
        (
            "lengths compared with <= instead of < (off by one): a sequence of length L has "
            "real tokens at positions 0..L-1, so position L is already padding",
            lambda: positions[None, :] <= lengths[:, None],
        ),
        (
            "`max_len` is ignored: the mask must have max_len columns when max_len is given",
            lambda: torch.arange(int(lengths.max()))[None, :] < lengths[:, None],
        ),
        (
            "the mask is transposed: its shape is (B, max_len), one row per sequence",
            lambda: (positions[None, :] < lengths[:, None]).T,
        ),
        (
            "the number of columns is the batch size len(lengths): `max_len` defaults to "
            "max(lengths), the longest sequence",
            lambda: torch.arange(len(lengths))[None, :] < lengths[:, None],
        ),
    ]


_LIST_HINT = (
    "`lengths` may be a list of ints as well as a tensor (the statement allows both): "
    "convert it first, `lengths = torch.as_tensor(lengths)`"
)


def _padding_case(candidate, lengths: list[int], max_len: int | None = None, as_list: bool = False):
    def run():
        lengths_t = torch.tensor(lengths)
        expected = ref.padding_mask(lengths_t, max_len)
        given = list(lengths) if as_list else lengths_t
        args = (given,) if max_len is None else (given, max_len)
        shown = f"{lengths}" if as_list else f"torch.tensor({lengths})"
        what = f"padding_mask({shown}" + (")" if max_len is None else f", max_len={max_len})")
        got = call_student(
            candidate,
            *args,
            what=what,
            arg_names=("lengths",),
            error_hint=_LIST_HINT if as_list else None,
        )
        mistakes = _padding_mistakes(lengths_t, max_len)
        if (
            isinstance(got, torch.Tensor)
            and got.dtype != torch.bool
            and got.shape == expected.shape
        ):
            try:
                same = torch.equal(got.detach().bool(), expected)
            except Exception:  # noqa: BLE001
                same = False
            if same:
                raise CaseFailed(
                    f"the mask has dtype {got.dtype}, expected torch.bool (True = real token): "
                    f"{_BOOL_HINT}"
                )
        expect_close(got, expected, "the mask", mistakes=mistakes)

    return run


_MOVES = (".cpu()", ".to(", "'cpu'", '"cpu"', ".numpy()")
"""What a line that moves `lengths` off its device contains."""


def _padding_meta_case(candidate, max_len: int):
    """The result goes on the device of `lengths`: "meta" exists on every machine and holds
    no data, so a mask built on the CPU (the device of `lengths` ignored) shows at once."""

    def run():
        meta = torch.device("meta")
        lengths = torch.tensor([2, 4, 1], device=meta)
        try:
            got = call_student(
                candidate,
                lengths,
                max_len,
                what=f"padding_mask(lengths on the meta device, max_len={max_len})",
                arg_names=("lengths",),
            )
        except CaseFailed as failure:
            text = str(failure)
            if "device" in text.splitlines()[0] and "meta tensor" not in text:
                # e.g. "Tensor on device meta is not on the expected device cpu!": a tensor
                # made on the CPU (`torch.arange(max_len)`) met `lengths` on the meta device
                where = text.split("\n", 1)[1].split("\nHint:")[0] if "\n" in text else ""
                raise CaseFailed(
                    "the mask must be made on the device of `lengths` (device=lengths.device): "
                    "a tensor made on the CPU met `lengths` on the meta device\n"
                    + text.splitlines()[0]
                    + (f"\n{where}" if where else "")
                    + "\nHint: create the positions there, `torch.arange(max_len, "
                    "device=lengths.device)`; `torch.arange(max_len)` alone is made on the CPU."
                ) from None
            if "meta tensor" not in text:
                raise
            line = text.split("\nat line ", 1)[1].split("\n", 1)[0] if "\nat line " in text else ""
            if any(move in line for move in _MOVES):
                raise CaseFailed(
                    f"the device of `lengths` is ignored: {text.splitlines()[0]}\nat line "
                    f"{line}\nHint: the mask goes on the device of `lengths`: do not move "
                    "`lengths` to the CPU; build the positions there, "
                    "`torch.arange(max_len, device=lengths.device)`."
                ) from None
            # The code reads the values of `lengths` (a loop, int(), .item(), .tolist()),
            # which is allowed but impossible on the data-less meta device.
            return (
                "not checked on this machine: your code reads the values of `lengths`, which "
                "the data-less meta device cannot provide; make sure the mask is created "
                "with `device=lengths.device`"
            )
        expect_meta_mask(
            got,
            (3, max_len),
            lambda device: (
                f"the device of `lengths` is ignored: with `lengths` on the meta device the "
                f"mask came back on {device}; build it on `lengths.device`, e.g. "
                "`torch.arange(max_len, device=lengths.device)`, and do not move `lengths` "
                "(no `.cpu()`)"
            ),
        )

    return run


@checker("padding_mask")
def check_padding_mask(candidate) -> list[Case]:
    """Check ``padding_mask(lengths, max_len=None) -> bool (B, max_len)``, True at real
    tokens."""
    return [
        Case("lengths [3, 1, 4], max_len from the lengths", _padding_case(candidate, [3, 1, 4])),
        Case(
            "lengths [2, 5], max_len=7",
            _padding_case(candidate, [2, 5], 7),
            covers=frozenset({"max_len"}),
        ),
        Case(
            "an empty sequence (length 0)",
            _padding_case(candidate, [0, 2], 3),
            covers=frozenset({"max_len"}),
        ),
        Case(
            "no padding at all", _padding_case(candidate, [3, 3], 3), weight=TRIVIAL, support=True
        ),
        Case("a single sequence", _padding_case(candidate, [4], 6), weight=TRIVIAL),
        Case(
            "lengths as a Python list [2, 4, 1]",
            _padding_case(candidate, [2, 4, 1], as_list=True),
            covers=frozenset({"lengths=list"}),
        ),
        Case(
            "lengths as a list [1, 3], max_len=5",
            _padding_case(candidate, [1, 3], 5, as_list=True),
            covers=frozenset({"lengths=list", "max_len"}),
        ),
        Case(
            "the mask goes on the device of `lengths` (meta device)",
            _padding_meta_case(candidate, 5),
            covers=frozenset({"max_len", "device=meta"}),
            support=True,
        ),
    ]
