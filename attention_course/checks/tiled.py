"""Checkers for chapter 12's efficient attention: ``online_softmax_update(m, l, acc, scores,
values)`` (one block of keys folded into the running maximum, sum and weighted sum) and
``tiled_attention_loop(query, key, value, block_q, block_k, causal=False)`` (attention
tile by tile, never holding the ``T x S`` scores)."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from attention_course import attention as attention_ref
from attention_course import tiled as ref

from ._compare import expect_close, expect_tuple, fmt_shape, matches, tolerances
from ._data import randn
from ._runner import TRIVIAL, Case, CaseFailed, call_student, checker, forbid_builtins
from ._sizes import record_sizes

# ---------------------------------------------------------------- the known mistakes

NO_RESCALE = (
    "the old sums are not rescaled when the maximum grows (only the new block's terms use "
    "the new maximum m'): l and acc were measured against the old maximum m, so multiply "
    "both by e^{m - m'} before adding the block, l' = e^{m - m'} l + sum e^{s - m'} and "
    "acc' = e^{m - m'} acc + e^{s - m'} @ v"
)
SUM_NOT_RESCALED = (
    "the running sum l is not rescaled: you multiply acc by e^{m - m'} but add the new "
    "terms to the old l as it is; l' = e^{m - m'} l + sum_j e^{s_j - m'}"
)
ACC_NOT_RESCALED = (
    "the accumulator acc is not rescaled: you multiply l by e^{m - m'} but add the new "
    "block to the old acc as it is; acc' = e^{m - m'} acc + e^{s - m'} @ v (chapter 12's "
    "warning: both sums, or the output is wrong whenever the maximum moves)"
)
DIVIDED_TOO_EARLY = (
    "the accumulator is divided by l too early, inside the loop: acc must stay the "
    "unnormalised sum of e^{s - m} v, rescaled by e^{m - m'} at every block; divide "
    "acc / l once, after the last block of keys"
)
BLOCK_MAX_ONLY = (
    "the new maximum is the block's maximum only: m' = max(m, max_j s_j), the larger of the "
    "running maximum and the block's (a block whose scores are all lower must not lower m)"
)
RESCALE_INVERTED = (
    "the rescaling factor is inverted: e^{m' - m} instead of e^{m - m'} (it must be at "
    "most 1, since m' >= m)"
)
MASKED_BLOCK_NAN = (
    "a fully masked block gives NaN: while a row has seen only masked scores its maximum "
    "is -inf, and -inf - (-inf) = NaN in e^{s - m'} and e^{m - m'}; where m' is -inf take "
    "the exponents relative to 0 instead (`torch.where(torch.isneginf(m_new), 0, m_new)`), "
    "so the row keeps l = 0 and acc = 0"
)
OLD_MAX_EXPONENT = (
    "the exponents are measured from the old maximum m, not the new one m': e^{s - m} is "
    "e^{s} on the first block (m = -inf) and has a positive exponent whenever a block "
    "raises the maximum, so it overflows for large scores (inf * 0 = NaN); take "
    "p = e^{s - m'} with m' = max(m, max_j s_j), every exponent at most 0"
)
MASKED_AS_LOWEST = (
    "a fully masked row counts its masked keys: with the masked scores replaced by the "
    "dtype's most negative number, a block that is all masked has m' equal to that number "
    "and e^{s - m'} = e^0 = 1 for every masked key, so l' = Sb instead of 0; keep masked "
    "scores at -inf (their e^{s - m'} is then 0) and take the exponents relative to 0 "
    "where m' is -inf"
)
MASKED_MAX_ZERO = (
    "a fully masked row's maximum comes back as 0: read -inf as 0 only for the shift of the "
    "exponents (`torch.where(torch.isneginf(m_new), 0, m_new)`) and return m' = -inf itself "
    "(or the dtype's most negative number); with m' = 0 a later block rescales the sums by "
    "e^{0 - m''} although they measured nothing"
)
RAW_EXP = (
    "e^{s} of the raw scores overflows: subtract the running maximum first, p = e^{s - m'}, "
    "so that every exponent is at most 0"
)
INIT_ZERO = (
    "the running maximum starts at 0 instead of -inf: when every score of a row is very "
    "negative, e^{s - 0} underflows to 0, l ends at 0 and acc / l is 0 / 0; start with "
    "m = -inf (chapter 12, step 4) or the dtype's most negative finite number"
)
NO_SCALE = (
    "the scores are not scaled by 1/sqrt(d_k): multiply q @ k^T by 1/sqrt(d_k), d_k = "
    "query.shape[-1] (chapter 4)"
)
LAST_QUERY_BLOCK_DROPPED = (
    "the last, shorter block of queries is left out: when block_q does not divide T, the "
    "loop must still visit the final T % block_q queries, `for q0 in range(0, T, block_q)` "
    "with the slice `q0 : q0 + block_q`"
)
SCALE_DV = (
    "the scores are scaled by 1/sqrt(Dv), the values' width: the scale is 1/sqrt(d_k), "
    "d_k = query.shape[-1] (the width of the queries and keys whose dot product it tames)"
)
LAST_KEY_BLOCK_DROPPED = (
    "the last, shorter block of keys is left out: when block_k does not divide S, the loop "
    "must still visit the final S % block_k keys, `for k0 in range(0, S, block_k)` with the "
    "slice `k0 : k0 + block_k` (Python slices stop at the end by themselves)"
)
CAUSAL_IGNORED = (
    "causal=True is ignored: query i may see key j only when j <= i; mask each tile with "
    "its rows' and columns' positions, q0 + r and k0 + c"
)
CAUSAL_NO_DIAGONAL = (
    "your causal mask hides the diagonal: query i must see key i itself, mask j > i only"
)
CAUSAL_LOCAL = (
    "the causal mask uses positions inside the tile (r and c) instead of the sequence "
    "positions (q0 + r and k0 + c): compare the absolute positions"
)
FULL_SCORES = (
    "your code creates a tensor of {elements:,} elements ({shape}, {dtype}, made by {op}), "
    "at least T·S = {T} × {S} = {limit:,}: that is the whole score matrix (or a mask of "
    "its size) at once, which tiling exists to avoid; compute one block_q × block_k tile "
    "of scores at a time (and the causal condition from the tile's positions)"
)
TILE_LIMIT = (
    "your code creates a tensor of {elements:,} elements ({shape}, {dtype}, made by {op}), "
    "more than the {limit:,} that tiling ever needs (the largest of the inputs, the output "
    "and one tile: batch × block_q × block_k × max(Dk, Dv) = {tile:,})"
)
WHOLE_ROW = (
    ": you hold a whole row of scores (block_q × S), a loop over query blocks only with "
    "the softmax of full rows; loop over key blocks too and fold each block_q × block_k "
    "tile into the online-softmax state"
)
WHOLE_COLUMN = (
    ": you hold a whole column of scores (T × block_k), all T queries at once against one "
    "block of keys; loop over query blocks too, block_q rows at a time"
)
WHOLE_SQUARE = (
    ": a T × T matrix (a causal_mask(T), say) is as quadratic as the scores, even when it "
    "is smaller than T × S; build the mask of each tile from its positions (two "
    "`torch.arange`)"
)
NO_NUMPY = (
    "do not use numpy in tiled_attention_loop: compute in PyTorch, because the size of "
    "every tensor your loop creates is part of the check (a T × S mask or score matrix in "
    "numpy, or in a Python list, is still the whole matrix)"
)

_NO_BUILTIN = (
    "do not call `F.scaled_dot_product_attention`: the task is to compute attention "
    "yourself, tile by tile, with the online softmax"
)

# ---------------------------------------------------------------- mistaken updates


def _update_variant(rescale_l=True, rescale_acc=True, divide=False, block_max=False, flip=False):
    """An online-softmax step with one known mistake (the reference when all are off)."""

    def update(m, l, acc, s, v):  # noqa: E741
        block = s.amax(dim=-1, keepdim=True)
        m_new = block if block_max else torch.maximum(m, block)
        shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - shift)
        c = torch.exp(m - shift)
        if flip:  # a row that saw nothing still has c = 0: e^{m' - m} would be inf there
            c = torch.where(torch.isneginf(m), 0.0, torch.exp(shift - m))
        l_new = (c * l if rescale_l else l) + p.sum(dim=-1, keepdim=True)
        acc_new = (c * acc if rescale_acc else acc) + p @ v
        if divide:
            acc_new = acc_new / l_new
        return m_new, l_new, acc_new

    return update


def _masked_as_lowest(m, l, acc, s, v):  # noqa: E741
    """Masked scores replaced by the dtype's most negative number before the update."""
    s = s.clamp_min(torch.finfo(s.dtype).min)
    m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
    shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    p, c = torch.exp(s - shift), torch.exp(m - shift)
    return m_new, c * l + p.sum(dim=-1, keepdim=True), c * acc + p @ v


def _masked_max_zero(m, l, acc, s, v):  # noqa: E741
    """The right sums, but m' = 0 returned for a row that has seen only masked scores."""
    m_new, l_new, acc_new = _update_variant()(m, l, acc, s, v)
    return torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new), l_new, acc_new


def _raw_exp(m, l, acc, s, v):  # noqa: E741
    """Exponents of the raw scores, no maximum subtracted: overflows for large scores."""
    m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
    p = torch.exp(s)
    return m_new, l + p.sum(dim=-1, keepdim=True), acc + p @ v


def _old_max_exponent(m, l, acc, s, v):  # noqa: E741
    """Exponents taken from the old maximum, rescaled afterwards: e^{s - m} e^{m - m'}
    (with -inf read as 0), e^{s} on the first block, NaN once e^{s - m} overflows."""
    m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))

    def z(x):
        return torch.where(torch.isinf(x), torch.zeros_like(x), x)

    p = torch.exp(s - z(m)) * torch.exp(z(m) - z(m_new))
    c = torch.exp(m - z(m_new))
    return m_new, c * l + p.sum(dim=-1, keepdim=True), c * acc + p @ v


def _nan_on_masked(m, l, acc, s, v):  # noqa: E741
    """The recurrence without the -inf guard: NaN where a row has seen only masked scores."""
    m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
    p, c = torch.exp(s - m_new), torch.exp(m - m_new)
    return m_new, c * l + p.sum(dim=-1, keepdim=True), c * acc + p @ v


BLOCK_OWN_MAX = (
    "the new block's exponents are taken from the block's own maximum, e^{s - max(block)}: "
    "measure them against the new running maximum m', e^{s - m'}, the reference the old "
    "sums are rescaled to with e^{m - m'}"
)
MAX_NOT_PER_ROW = (
    "the maximum is not taken per query row (over the query axis too, or over the whole "
    "block): each row has its own m, `torch.maximum(m, scores.amax(-1, keepdim=True))`"
)


def _block_own_max(m, l, acc, s, v):  # noqa: E741
    """e^{s - blockmax} added to sums rescaled to m': two different references."""
    block = s.amax(dim=-1, keepdim=True)
    m_new = torch.maximum(m, block)

    def z(x):
        return torch.where(torch.isneginf(x), torch.zeros_like(x), x)

    p, c = torch.exp(s - z(block)), torch.exp(m - z(m_new))
    return m_new, c * l + p.sum(dim=-1, keepdim=True), c * acc + p @ v


def _max_over(dims):
    """The right recurrence with the block's maximum taken over ``dims`` (None: all)."""

    def update(m, l, acc, s, v):  # noqa: E741
        block = s.amax(dim=dims, keepdim=True) if dims is not None else s.max()
        m_new = torch.maximum(m, block)
        shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
        p, c = torch.exp(s - shift), torch.exp(m - shift)
        return m_new, c * l + p.sum(dim=-1, keepdim=True), c * acc + p @ v

    return update


UPDATE_MISTAKES = [
    (NO_RESCALE, _update_variant(rescale_l=False, rescale_acc=False)),
    (SUM_NOT_RESCALED, _update_variant(rescale_l=False)),
    (ACC_NOT_RESCALED, _update_variant(rescale_acc=False)),
    (DIVIDED_TOO_EARLY, _update_variant(divide=True)),
    (BLOCK_MAX_ONLY, _update_variant(block_max=True)),
    (RESCALE_INVERTED, _update_variant(flip=True)),
    (MASKED_BLOCK_NAN, _nan_on_masked),
    (OLD_MAX_EXPONENT, _old_max_exponent),
    (MASKED_AS_LOWEST, _masked_as_lowest),
    (MASKED_MAX_ZERO, _masked_max_zero),
    (RAW_EXP, _raw_exp),
    (BLOCK_OWN_MAX, _block_own_max),
    (MAX_NOT_PER_ROW, _max_over((-2, -1))),
    (MAX_NOT_PER_ROW, _max_over(None)),
]

# ---------------------------------------------------------------- online_softmax_update

_STATE = ("m", "l", "acc")


def _start(T: int, Dv: int, batch=(), dtype=torch.float64):
    m = torch.full((*batch, T, 1), -math.inf, dtype=dtype)
    return m, torch.zeros((*batch, T, 1), dtype=dtype), torch.zeros((*batch, T, Dv), dtype=dtype)


def _accept_lowest(m: torch.Tensor) -> torch.Tensor:
    """The student's ``m`` with the most negative finite number read as -inf (both are a
    fine maximum for a row that has seen nothing)."""
    if not isinstance(m, torch.Tensor) or not m.is_floating_point():
        return m
    return m.masked_fill(m.detach() <= torch.finfo(m.dtype).min, -math.inf)


def _triple_matches(got, want, dtype) -> bool:
    atol, rtol = tolerances(dtype)
    return all(
        isinstance(g, torch.Tensor) and matches(g.detach().cpu(), w, atol, rtol)
        for g, w in zip(got, want)
    )


def _diagnose(got, inputs, expected, dtype, mistakes) -> str | None:
    """The known mistake whose whole state (m', l', acc') equals the candidate's."""
    for description, update in mistakes:
        try:
            wrong = update(*inputs)
        except Exception:  # noqa: BLE001
            continue
        wrong = (_accept_lowest(wrong[0]), *wrong[1:])  # as the candidate's m is read
        if _triple_matches(wrong, expected, dtype):
            continue  # this mistake gives the right answer here: it says nothing
        if _triple_matches(got, wrong, dtype):
            return description
    return None


def _expect_state_shapes(got, shapes, what: str) -> None:
    """Each returned tensor of ``(m', l', acc')`` must have its shape (checked before any
    value is used); a reduction that dropped the last axis is named."""
    for value, shape, name in zip(got, shapes, _STATE):
        if not isinstance(value, torch.Tensor) or tuple(value.shape) == tuple(shape):
            continue
        message = (
            f"{name}' returned by {what}: expected shape {fmt_shape(shape)}, got "
            f"{fmt_shape(value.shape)}"
        )
        if name != "acc" and tuple(value.shape) == tuple(shape[:-1]):
            message += (
                f"\nLikely mistake: {name}' lost its last axis of size 1: m and l are "
                "(..., T, 1), one number per query row, so reduce with keepdim=True "
                "(`scores.amax(-1, keepdim=True)`, `p.sum(-1, keepdim=True)`) and do not squeeze"
            )
        raise CaseFailed(message)


def _expect_state(got, expected, inputs, what: str) -> None:
    got = expect_tuple(got, 3, what, _STATE)
    _expect_state_shapes(got, [t.shape for t in expected], what)
    got = (_accept_lowest(got[0]), got[1], got[2])
    dtype = expected[0].dtype
    mistake = _diagnose(got, inputs, expected, dtype, UPDATE_MISTAKES)
    for value, want, name in zip(got, expected, _STATE):
        try:
            expect_close(value, want, f"{name}' returned by {what}")
        except CaseFailed as error:
            message = str(error)
            if mistake is not None and "\nLikely mistake:" not in message:
                message += f"\nLikely mistake: {mistake}."
            elif mistake is None and "NaN" in message and "\nLikely mistake:" not in message:
                if any(bool(torch.isneginf(s).all(dim=-1).any()) for s in inputs[3:4]):
                    message += f"\nLikely mistake: {MASKED_BLOCK_NAN}."
                elif any(float(s[torch.isfinite(s)].abs().max()) > 80 for s in inputs[3:4]):
                    message += f"\nLikely mistake: {RAW_EXP}."
            raise CaseFailed(message) from None


def _update_what(m, scores, values) -> str:
    dtype = str(scores.dtype).replace("torch.", "")
    return (
        f"online_softmax_update(m {fmt_shape(m.shape)}, l, acc, scores "
        f"{fmt_shape(scores.shape)} {dtype}, values {fmt_shape(values.shape)})"
    )


def _update_case(candidate, state, scores, values):
    """One step from ``state`` (given, or None for the start state) on one block."""

    def run():
        m, l, acc = state() if callable(state) else state  # noqa: E741
        inputs = (m.clone(), l.clone(), acc.clone(), scores.clone(), values.clone())
        expected = ref.online_softmax_update(*inputs)
        what = _update_what(m, scores, values)
        got = call_student(
            candidate,
            *(t.clone() for t in inputs),
            what=what,
            arg_names=("m", "l", "acc", "scores", "values"),
        )
        _expect_state(got, expected, inputs, what)

    return run


def _after(blocks, T: int, Dv: int, batch=(), dtype=torch.float64):
    """The reference state after folding ``blocks`` (a list of (scores, values))."""

    def state():
        current = _start(T, Dv, batch, dtype)
        for s, v in blocks:
            current = ref.online_softmax_update(*current, s, v)
        return current

    return state


def _chain_case(candidate, scores, values, block: int):
    """All the blocks of the rows in turn from the start state; acc / l = softmax @ V."""

    def run():
        T, S = scores.shape
        state = _start(T, values.shape[-1])
        for k0 in range(0, S, block):
            s, v = scores[:, k0 : k0 + block], values[k0 : k0 + block]
            what = _update_what(state[0], s, v)
            got = call_student(candidate, *state, s.clone(), v.clone(), what=what)
            got = expect_tuple(got, 3, what, _STATE)
            _expect_state_shapes(got, [t.shape for t in _start(T, values.shape[-1])], what)
            state = (_accept_lowest(got[0]), got[1], got[2])
        expected = torch.softmax(scores, dim=-1) @ values
        name = f"acc / l after all {math.ceil(S / block)} blocks of {block} keys"
        out = state[2] / state[1] if all(isinstance(t, torch.Tensor) for t in state) else None
        mistakes = []
        for description, update in UPDATE_MISTAKES:

            def wrong(update=update):
                current = _start(T, values.shape[-1])
                for k0 in range(0, S, block):
                    current = update(*current, scores[:, k0 : k0 + block], values[k0 : k0 + block])
                return current[2] / current[1]

            mistakes.append((description, wrong))
        expect_close(
            out, expected, name + " (should equal softmax(scores) @ values)", mistakes=mistakes
        )

    return run


@checker("online_softmax_update", chapter="12_efficient_attention")
def check_online_softmax_update(candidate) -> list[Case]:
    """Check ``online_softmax_update(m, l, acc, scores, values) -> (m', l', acc')``: the
    running maximum, the running sum of ``e^{s - m}`` and of ``e^{s - m} v``, rescaled by
    ``e^{m - m'}`` when a block raises the maximum; masked scores are ``-inf``."""
    T, Dv = 4, 2
    low = randn(T, 3, seed=1)  # scores of a first block
    high = randn(T, 3, seed=2) + 4.0  # a second block whose scores beat the first's ...
    high = high + (low.max(-1).values + 0.5 - high.min(-1).values).clamp(min=0.0)[:, None]
    # ... each by 0.5 or more, under every seed (a block of one key too)
    v1, v2 = randn(3, Dv, seed=3), randn(3, Dv, seed=4)
    mixed = torch.cat([randn(2, 4, seed=5) + 3.0, randn(3, 4, seed=6) - 3.0])  # rows up, down
    # rows 0 and 2 fully masked; rows 1 and 3 (one score masked in row 1) raise the maximum
    # that `low` left, by 0.5 or more, so a missing rescale shows under every seed
    masked = randn(T, 3, seed=7)
    lift = (low.max(-1).values + 0.5 - masked[:, 1:].max(-1).values).clamp(min=0.0)
    masked = (masked + lift[:, None]).masked_fill(
        torch.tensor([[True], [False], [True], [False]]), -math.inf
    )
    masked[1, 0] = -math.inf  # a row with one masked score
    big = randn(T, 3, seed=8) + 1000.0
    bigger = randn(T, 3, seed=9) + 1010.0
    row_scores = torch.tensor(
        [
            [1.0, 3.0, 2.0, 6.0, 0.5, 4.0, 9.0, 1.5, 2.5, 7.0],
            [0.0, -1.0, 2.0, 0.5, 5.0, 1.0, -2.0, 3.0, 8.0, 0.0],
        ],
        dtype=torch.float64,
    )
    row_values = randn(10, 3, seed=10)
    b_state = _after(
        [(randn(2, 5, 3, seed=11).float(), randn(2, 3, 3, seed=12).float())],
        5,
        3,
        (2,),
        torch.float32,
    )
    b_scores = torch.cat(
        [randn(2, 2, 4, seed=13) + 2.5, randn(2, 3, 4, seed=14) - 2.5], dim=1
    ).float()
    return [
        Case(
            "the first block, from the start state m = -inf, l = 0, acc = 0",
            _update_case(candidate, _start(T, Dv), low, v1),
        ),
        Case(
            "a second block whose maximum is larger: the old sums must be rescaled",
            _update_case(candidate, _after([(low, v1)], T, Dv), high, v2),
            covers=frozenset({"maximum grows"}),
        ),
        Case(
            "a second block whose scores are all lower: m stays, nothing is rescaled",
            _update_case(candidate, _after([(high, v2)], T, Dv), low, v1),
            covers=frozenset({"maximum stays"}),
        ),
        Case(
            "rows whose maximum grows next to rows whose maximum stays",
            _update_case(
                candidate,
                _after([(randn(5, 4, seed=15), randn(4, 2, seed=16))], 5, 2),
                mixed,
                randn(4, 2, seed=17),
            ),
            covers=frozenset({"maximum grows", "maximum stays"}),
        ),
        Case(
            "a fully masked block first (m stays -inf, l = 0, acc = 0; no NaN)",
            _update_case(candidate, _start(T, Dv), masked, v1),
            covers=frozenset({"fully masked block"}),
        ),
        Case(
            "a fully masked block after real scores leaves the state unchanged",
            _update_case(candidate, _after([(low, v1)], T, Dv), masked, v2),
            covers=frozenset({"fully masked block"}),
        ),
        Case(
            "scores near 1,000: e^{s - m'} never overflows",
            _update_case(candidate, _after([(big, v1)], T, Dv), bigger, v2),
            covers=frozenset({"large scores"}),
        ),
        Case(
            "scores near 1,000 from the start state (m = -inf): every exponent is at most 0",
            _update_case(candidate, _start(T, Dv), bigger, v1),
            covers=frozenset({"large scores"}),
        ),
        Case(
            "a batch (2, T, Sb) in float32: the result keeps float32",
            _update_case(candidate, b_state, b_scores, randn(2, 4, 3, seed=18).float()),
            covers=frozenset({"batch", "dtype=float32"}),
        ),
        Case(
            "a block of one key",
            _update_case(candidate, _after([(low, v1)], T, Dv), high[:, :1], v2[:1]),
            weight=TRIVIAL,
            covers=frozenset({"Sb=1"}),
        ),
        Case(
            "two rows of ten scores, three at a time: acc / l = softmax(scores) @ values",
            _chain_case(candidate, row_scores, row_values, 3),
            covers=frozenset({"chained"}),
        ),
    ]


# ---------------------------------------------------------------- tiled_attention_loop


def _loop(
    query,
    key,
    value,
    block_q,
    block_k,
    causal=False,
    *,
    update=None,
    init=-math.inf,
    scale=True,
    keys_to=None,
    local_causal=False,
    strict=False,
    divide_inside=False,
    final_divide=True,
    queries_to=None,
    scale_dim=None,
):
    """A tiled loop with one known mistake (the reference when every option is default)."""
    update = update or ref.online_softmax_update
    T, S = query.shape[-2], key.shape[-2]
    S_used = S if keys_to is None else keys_to
    factor = 1.0 / math.sqrt(scale_dim or query.shape[-1]) if scale else 1.0
    outputs = []
    for q0 in range(0, T if queries_to is None else queries_to, block_q):
        q = query[..., q0 : q0 + block_q, :] * factor
        Tb = q.shape[-2]
        m = torch.full((*q.shape[:-1], 1), init, dtype=q.dtype)
        l = torch.zeros_like(m)  # noqa: E741
        acc = q.new_zeros((*q.shape[:-1], value.shape[-1]))
        for k0 in range(0, S_used, block_k):
            s = q @ key[..., k0 : k0 + block_k, :].transpose(-2, -1)
            if causal:
                r = torch.arange(Tb)[:, None] + (0 if local_causal else q0)
                c = torch.arange(s.shape[-1])[None, :] + (0 if local_causal else k0)
                s = s.masked_fill(c >= r if strict else c > r, -math.inf)
            m, l, acc = update(m, l, acc, s, value[..., k0 : k0 + block_k, :])  # noqa: E741
            if divide_inside:
                acc = acc / l
        outputs.append(acc / l if final_divide else acc)
    return torch.cat(outputs, dim=-2)


def _loop_mistakes(q, k, v, block_q, block_k, causal):
    args = (q, k, v, block_q, block_k, causal)
    T, S = q.shape[-2], k.shape[-2]
    found = [(INIT_ZERO, lambda: _loop(*args, init=0.0))]
    found += [
        (description, lambda update=update: _loop(*args, update=update))
        for description, update in UPDATE_MISTAKES
        if description != MASKED_BLOCK_NAN
    ]
    found += [
        (DIVIDED_TOO_EARLY, lambda: _loop(*args, divide_inside=True)),
        (DIVIDED_TOO_EARLY, lambda: _loop(*args, divide_inside=True, final_divide=False)),
        (LAST_QUERY_BLOCK_DROPPED, lambda: _loop(*args, queries_to=T // block_q * block_q)),
        (NO_SCALE, lambda: _loop(*args, scale=False)),
        (SCALE_DV, lambda: _loop(*args, scale_dim=v.shape[-1])),
        (LAST_KEY_BLOCK_DROPPED, lambda: _loop(*args, keys_to=S // block_k * block_k)),
    ]
    if causal:
        found += [
            (CAUSAL_IGNORED, lambda: _loop(q, k, v, block_q, block_k, False)),
            (CAUSAL_NO_DIAGONAL, lambda: _loop(*args, strict=True)),
            (CAUSAL_LOCAL, lambda: _loop(*args, local_causal=True)),
        ]
    return found


def _expected(q, k, v, causal):
    T, S = q.shape[-2], k.shape[-2]
    mask = torch.ones(T, S, dtype=torch.bool).tril() if causal else None
    return attention_ref.scaled_dot_product_attention(q, k, v, mask=mask)[0]


_NUMPY = (
    "array",
    "asarray",
    "ones",
    "zeros",
    "full",
    "empty",
    "ones_like",
    "zeros_like",
    "full_like",
    "empty_like",
    "arange",
    "tri",
    "tril",
    "triu",
    "indices",
    "meshgrid",
    "fromfunction",
    "greater",
    "less",
    "greater_equal",
    "less_equal",
    "where",
    "exp",
    "matmul",
    "einsum",
    "dot",
)
"""The numpy functions refused while the loop runs: the size recorder sees PyTorch's
allocations only, so a mask or scores built in numpy would escape it."""


def tile_limit(q, k, v, out, block_q: int, block_k: int) -> tuple[int, int]:
    """(limit, tile): no tensor the loop creates may have more elements than the largest of
    the inputs, the output and one tile of scores. The reference holds the output and one
    ``batch × block_q × block_k`` tile; a tile computed by broadcasting
    (``(q[..., :, None, :] * k[..., None, :, :]).sum(-1)``) needs ``× Dk`` more, and a
    tile's ``p @ v`` is ``batch × block_q × Dv``: hence the factor max(Dk, Dv)."""
    batch = math.prod(q.shape[:-2])
    T, S = q.shape[-2], k.shape[-2]
    tile = batch * min(block_q, T) * min(block_k, S) * max(q.shape[-1], v.shape[-1])
    return max(q.numel(), k.numel(), v.numel(), out.numel(), tile), tile


def _expect_tiles(largest, what, q, k, v, out, block_q: int, block_k: int) -> None:
    T, S = q.shape[-2], k.shape[-2]
    limit, tile = tile_limit(q, k, v, out, block_q, block_k)
    if largest.elements <= limit:
        return
    found = dict(
        elements=largest.elements,
        shape=fmt_shape(largest.shape),
        dtype=largest.dtype.replace("torch.", ""),
        op=largest.op,
    )
    if largest.elements >= T * S:
        raise CaseFailed(f"{what}: " + FULL_SCORES.format(**found, T=T, S=S, limit=T * S))
    message = f"{what}: " + TILE_LIMIT.format(**found, limit=limit, tile=tile)
    shape = tuple(largest.shape)
    if shape[-2:] == (T, T):
        message += WHOLE_SQUARE
    elif len(shape) >= 2 and shape[-1] == S and shape[-2] <= block_q:
        message += WHOLE_ROW
    elif len(shape) >= 2 and shape[-2] == T and shape[-1] <= block_k:
        message += WHOLE_COLUMN
    raise CaseFailed(message)


def _loop_case(
    candidate,
    shape,
    block_q,
    block_k,
    causal=False,
    *,
    seed,
    dtype=torch.float64,
    offset=0.0,
    guard=False,
):
    """``shape`` = (batch..., T, S, Dk, Dv); ``offset`` is added to every score (by a
    constant feature in the queries and keys)."""

    def run():
        *batch, T, S, Dk, Dv = shape
        q = randn(*batch, T, Dk, seed=seed, dtype=dtype)
        k = randn(*batch, S, Dk, seed=seed + 1, dtype=dtype)
        v = randn(*batch, S, Dv, seed=seed + 2, dtype=dtype)
        if offset:
            # the last feature of every query is sqrt(d_k) and of every key `offset`:
            # each scaled score moves by `offset`
            q[..., -1] = math.sqrt(Dk)
            k[..., -1] = offset
        expected = _expected(q, k, v, causal)
        flag = ", causal=True" if causal else ""
        what = (
            f"tiled_attention_loop(query {fmt_shape(q.shape)}, key {fmt_shape(k.shape)}, "
            f"value {fmt_shape(v.shape)}, block_q={block_q}, block_k={block_k}{flag})"
        )
        with (
            forbid_builtins([(F, "scaled_dot_product_attention")], _NO_BUILTIN),
            forbid_builtins([(np, name) for name in _NUMPY], NO_NUMPY, package_may=True),
            forbid_builtins([(torch, "from_numpy")], NO_NUMPY, package_may=True),
            record_sizes() as largest,
        ):
            got = call_student(
                candidate,
                q.clone(),
                k.clone(),
                v.clone(),
                block_q,
                block_k,
                **({"causal": True} if causal else {}),
                what=what,
                arg_names=("query", "key", "value"),
            )
        if guard:
            _expect_tiles(largest, what, q, k, v, expected, block_q, block_k)
        mistakes = _loop_mistakes(q, k, v, block_q, block_k, causal)
        expect_close(got, expected, f"the output of {what}", mistakes=mistakes)

    return run


_MEMORY = 3.0
"""The weight of each "never builds T × S" case: memory is what the task is about, so right
values computed from the whole score matrix keep the score below 0.6."""


@checker(
    "tiled_attention_loop",
    chapter="12_efficient_attention",
    answer_builtins=(
        "torch.nn.functional.scaled_dot_product_attention",
        "torch._C._nn.scaled_dot_product_attention",
    ),
)
def check_tiled_attention_loop(candidate) -> list[Case]:
    """Check ``tiled_attention_loop(query, key, value, block_q, block_k, causal=False)``:
    softmax(Q K^T / sqrt(d_k)) V computed one ``block_q x block_k`` tile at a time with
    the online softmax, equal to scaled dot-product attention; in the cases marked "never
    builds T × S" no tensor it creates has more elements than the largest of the inputs,
    the output and one tile (:func:`tile_limit`), and numpy is refused."""
    return [
        Case(
            "T = S = 8, blocks of 4 and 4 (they divide the lengths)",
            _loop_case(candidate, (2, 8, 8, 4, 3), 4, 4, seed=1),
        ),
        Case(
            "T = 13, S = 11, blocks of 5 and 3: neither divides, Dk != Dv, (B, H) = (2, 3)",
            _loop_case(candidate, (2, 3, 13, 11, 6, 5), 5, 3, seed=4),
            covers=frozenset({"odd blocks", "T!=S", "B, H"}),
        ),
        Case(
            "blocks larger than T and S (one tile)",
            _loop_case(candidate, (2, 5, 6, 4, 3), 8, 8, seed=7),
            weight=TRIVIAL,
            covers=frozenset({"one tile"}),
        ),
        Case(
            "blocks of one query and one key",
            _loop_case(candidate, (1, 4, 5, 3, 2), 1, 1, seed=10),
            covers=frozenset({"block=1"}),
        ),
        Case(
            "causal, T = S = 10, blocks of 4 and 3",
            _loop_case(candidate, (2, 10, 10, 4, 3), 4, 3, True, seed=13),
            covers=frozenset({"causal"}),
        ),
        Case(
            "causal, T = 12, S = 7 and T = 5, S = 9 (query i sees keys j <= i)",
            _both(
                _loop_case(candidate, (2, 12, 7, 4, 3), 5, 2, True, seed=16),
                _loop_case(candidate, (2, 5, 9, 4, 3), 2, 4, True, seed=19),
            ),
            covers=frozenset({"causal", "causal T!=S"}),
        ),
        Case(
            "every score near -1,000 (the running maximum must start at -inf)",
            _loop_case(candidate, (2, 6, 7, 4, 3), 3, 2, seed=22, offset=-1000.0),
            covers=frozenset({"very negative scores"}),
        ),
        Case(
            "every score near +1,000 (exponents measured from the running maximum)",
            _loop_case(candidate, (2, 6, 7, 4, 3), 3, 2, seed=25, offset=1000.0),
            covers=frozenset({"large scores"}),
        ),
        Case(
            "float32 inputs: the result keeps float32",
            _loop_case(candidate, (2, 9, 10, 4, 3), 4, 3, seed=28, dtype=torch.float32),
            covers=frozenset({"dtype=float32"}),
        ),
        Case(
            "never builds T × S, nor a row or column of scores: T = 61, S = 67, blocks of 7 and 9",
            _loop_case(candidate, (2, 61, 67, 4, 3), 7, 9, seed=31, guard=True),
            weight=_MEMORY,
            covers=frozenset({"never T x S"}),
        ),
        Case(
            "never builds T × S, causal: T = 61, S = 67 and T = 67, S = 61, blocks of 7 and 9",
            _both(
                _loop_case(candidate, (2, 61, 67, 4, 3), 7, 9, True, seed=34, guard=True),
                _loop_case(candidate, (2, 67, 61, 4, 3), 7, 9, True, seed=37, guard=True),
            ),
            weight=_MEMORY,
            covers=frozenset({"never T x S", "causal", "causal T>S"}),
        ),
    ]


def _both(first, second):
    def run():
        first()
        second()

    return run
