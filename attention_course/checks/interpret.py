"""Checker for ``attention_rollout(attentions) -> (B, T, T)`` (Abnar & Zuidema, 2020):
per layer the head mean plus the identity, rows renormalised, multiplied from the last
layer down to the first."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from attention_course import interpret as ref

from ._compare import expect_close, sums_to_one_hint
from ._data import draw_until, generator, randn
from ._runner import TRIVIAL, Case, CaseFailed, call_student, checker

# ---------------------------------------------------------------- known mistakes


def _augment(w: torch.Tensor, fuse: str = "mean", identity: bool = True, renorm: str = "rows"):
    """One layer's matrix, (B, H, T, T) -> (B, T, T), the right way or a mistaken one."""
    if fuse == "mean":
        a = w.mean(dim=1)
    elif fuse == "max":
        a = w.amax(dim=1)
    else:  # "sum"
        a = w.sum(dim=1)
    if identity:
        a = a + torch.eye(a.shape[-1], dtype=a.dtype)
    if renorm == "rows":
        a = a / a.sum(dim=-1, keepdim=True)
    elif renorm == "columns":
        a = a / a.sum(dim=-2, keepdim=True)
    elif renorm == "half":  # 0.5 W + 0.5 I without dividing by the row sums
        a = a / 2
    return a


def _product(mats, order: str = "last first"):
    """``A_L @ ... @ A_1`` ("last first", the right order) or ``A_1 @ ... @ A_L``."""
    result = mats[0]
    for a in mats[1:]:
        result = a @ result if order == "last first" else result @ a
    return result


def _mistakes(attentions):
    layers = [w.detach() for w in attentions]

    def rollout(order="last first", **kwargs):
        return lambda: _product([_augment(w, **kwargs) for w in layers], order)

    return [
        (
            "your rollout multiplies in the wrong order, first layer last (A_1 @ A_2 @ ... @ "
            "A_L): information flows from layer 1 upwards, so each later layer multiplies on "
            "the left, R = A_L @ ... @ A_2 @ A_1",
            rollout(order="first last"),
        ),
        (
            "your rollout forgets the identity (the residual connection): each layer's "
            "matrix is A = head mean + I, rows renormalised (the paper's 0.5 W + 0.5 I), not "
            "the attention weights alone",
            rollout(identity=False),
        ),
        (
            "your layer matrices' rows sum to 2, not 1: the identity is added after the last "
            "renormalisation (or with none at all); divide head mean + I by its row sums, "
            "after adding I (the paper's 0.5 W + 0.5 I)",
            rollout(renorm="none"),
        ),
        (
            "your rollout multiplies the layers' matrices elementwise (`*`): combine them "
            "with matrix products (`@`), R = A_L @ ... @ A_1",
            lambda: torch.stack([_augment(w) for w in layers]).prod(dim=0),
        ),
        (
            "your rollout uses head 0 only: every head counts the same, average them "
            "(`w.mean(dim=1)`)",
            lambda: (
                _product([_augment(w[:, :1]) for w in layers])
                if any(w.shape[1] > 1 for w in layers)
                else None
            ),
        ),
        (
            "your rollout adds the identity (and renormalises) in the first layer only: the "
            "residual connection is in every layer, so each layer's matrix is head mean + I, "
            "rows renormalised",
            lambda: (
                _product([_augment(layers[0])] + [w.mean(dim=1) for w in layers[1:]])
                if len(layers) > 1
                else None
            ),
        ),
        (
            "your rollout renormalises the columns, not the rows: divide by "
            "`a.sum(dim=-1, keepdim=True)`, so that each query position's row sums to 1",
            rollout(renorm="columns"),
        ),
        (
            "your rollout takes the max over heads instead of the mean: average the heads, "
            "`w.mean(dim=1)` (max fusion is a later variant, not Abnar & Zuidema's rollout)",
            rollout(fuse="max"),
        ),
        (
            "your rollout sums the heads instead of averaging them: use `w.mean(dim=1)`, so "
            "that the attention and the identity weigh the same",
            rollout(fuse="sum"),
        ),
        (
            "your rollout returns only the last layer's matrix: multiply every layer's, "
            "R = A_L @ ... @ A_1",
            lambda: _augment(layers[-1]),
        ),
        (
            "your rollout returns only the first layer's matrix: multiply every layer's, "
            "R = A_L @ ... @ A_1",
            lambda: _augment(layers[0]),
        ),
        (
            "your rollout multiplies the raw head means and adds the identity only once, "
            "at the end: add I (and renormalise) in every layer, before the product",
            lambda: (lambda r: (r + torch.eye(r.shape[-1], dtype=r.dtype)) / 2)(
                _product([w.mean(dim=1) for w in layers])
            ),
        ),
        (
            "your rollout is transposed: R[b, i, j] is how much of input token j reaches "
            "output position i, so row i (not column i) is a distribution over inputs",
            lambda: _product([_augment(w) for w in layers]).transpose(-2, -1),
        ),
        (
            "your rollout averages the layers' matrices instead of multiplying them: "
            "R = A_L @ ... @ A_1",
            lambda: torch.stack([_augment(w) for w in layers]).mean(dim=0),
        ),
        (
            "your rollout divides every layer by the first layer's number of heads: each "
            "layer has its own number of heads, so average each over its own dim 1 "
            "(`w.mean(dim=1)`)",
            lambda: (
                _product([_augment(w * w.shape[1] / layers[0].shape[1]) for w in layers])
                if any(w.shape[1] != layers[0].shape[1] for w in layers)
                else None
            ),
        ),
        (
            "your rollout is the same for every batch element: average over the heads only "
            "(dim 1), not over the batch too",
            lambda: (
                _product([_augment(w.mean(dim=0, keepdim=True)) for w in layers]).expand_as(
                    _product([_augment(w) for w in layers])
                )
                if layers[0].shape[0] > 1
                else None
            ),
        ),
    ]


# ---------------------------------------------------------------- inputs


def _weights(B: int, H: int, T: int, *, seed: int, causal: bool = False, dtype=torch.float64):
    """Random attention weights (rows that sum to 1), spread so that layers differ."""
    scores = randn(B, H, T, T, seed=seed) * 1.5
    if causal:
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return scores.softmax(dim=-1).to(dtype)


def _describe(attentions) -> str:
    shapes = ", ".join(str(tuple(w.shape)) for w in attentions)
    dtype = str(attentions[0].dtype).replace("torch.", "")
    return f"attention_rollout([{shapes}]) {dtype}"


def _compare_case(candidate, make_attentions):
    def run():
        attentions = make_attentions()
        copies = [w.clone() for w in attentions]
        expected = ref.attention_rollout(copies)
        what = _describe(attentions)
        got = call_student(candidate, list(attentions), what=what)
        changed = [i for i, (w, c) in enumerate(zip(attentions, copies)) if not torch.equal(w, c)]
        if changed:
            raise CaseFailed(
                f"{what} changed attentions[{changed[0]}] in place (for example `w += eye` "
                "or `w /= ...`): compute new tensors and leave the inputs unchanged"
            )
        expect_close(
            got,
            expected,
            f"the rollout of {what}",
            mistakes=_mistakes(attentions),
            hints=[sums_to_one_hint(-1, "the input tokens j")],
        )

    return run


@checker("attention_rollout")
def check_attention_rollout(candidate) -> list[Case]:
    """Check ``attention_rollout(attentions) -> (B, T, T)``: per layer the head mean plus
    the identity, rows renormalised, multiplied from the last layer down to the first."""
    return [
        Case(
            "one layer, H=2, T=4",
            _compare_case(candidate, lambda: [_weights(1, 2, 4, seed=1)]),
            covers=frozenset({"L=1"}),
        ),
        Case(
            "two layers, H=2, T=5",
            _compare_case(
                candidate, lambda: [_weights(1, 2, 5, seed=2), _weights(1, 2, 5, seed=3)]
            ),
            covers=frozenset({"L>1"}),
        ),
        Case(
            "three layers with H = 3, 1, 4, causal weights, B=2, T=6",
            _compare_case(
                candidate,
                lambda: [
                    _weights(2, 3, 6, seed=4, causal=True),
                    _weights(2, 1, 6, seed=5, causal=True),
                    _weights(2, 4, 6, seed=6, causal=True),
                ],
            ),
            covers=frozenset({"L>1", "H differs between layers", "causal", "B>1"}),
        ),
        Case(
            "float32 weights, four layers, T=7: the result keeps float32",
            _compare_case(
                candidate,
                lambda: [_weights(2, 2, 7, seed=10 + i, dtype=torch.float32) for i in range(4)],
            ),
            covers=frozenset({"L>1", "B>1", "dtype=float32"}),
        ),
        Case(
            "identity attentions (each token attends to itself) give the identity",
            _compare_case(
                candidate, lambda: [torch.eye(4, dtype=torch.float64).expand(1, 2, 4, 4)] * 3
            ),
            weight=TRIVIAL,
            covers=frozenset({"L>1", "identity"}),
            support=True,
        ),
        Case(
            "T=1: a single token",
            _compare_case(candidate, lambda: [torch.ones(2, 2, 1, 1, dtype=torch.float64)] * 2),
            weight=TRIVIAL,
            covers=frozenset({"T=1", "B>1"}),
            support=True,
        ),
    ]


# ================================================================ induction_scores


def _induction_mistakes(weights: torch.Tensor, period: int, candidate=None):
    w = weights.detach()
    T = w.shape[-1]

    def reads_transposed() -> bool:
        # On causal weights, the entries above the diagonal (the transposed read) and the
        # weight on i - period are both all zeros. Telling them apart: on the transposed
        # weights (zero below the diagonal) only a read above the diagonal finds weight.
        if candidate is None or period >= T or w.triu(1).any():
            return False
        try:
            got = candidate(w.transpose(-2, -1).clone(), period)
            return bool(isinstance(got, torch.Tensor) and got.detach().abs().max() > 1e-6)
        except Exception:  # noqa: BLE001 - a probe that fails says nothing
            return False

    def transposed():
        return torch.diagonal(w, offset=period - 1, dim1=-2, dim2=-1)[..., :-1].mean(dim=(0, 2))

    transposed_read = (
        "your score reads the transposed entries w[..., i - period + 1, i] (key first), "
        "above the diagonal, where causal weights are 0: rows are queries, columns keys, "
        "so the entry is w[..., i, i - period + 1] "
        "(`torch.diagonal(w, offset=-(period - 1), dim1=-2, dim2=-1)`)"
    )

    def diagonal_mean(offset: int, skip: int, dims=(0, 2)):
        d = torch.diagonal(w, offset=-offset, dim1=-2, dim2=-1)[..., skip:]
        return d.mean(dim=dims)

    return [
        (  # all zeros on causal weights, like several other reads: first ask the student
            transposed_read,
            lambda: torch.zeros_like(w[0, :, 0, 0]) if reads_transposed() else None,
        ),
        (
            "your score reads the weight on i - period, the previous occurrence of the same "
            "token (a duplicate-token head), not the token after it: the induction offset is "
            "i - period + 1 (`torch.diagonal(w, offset=-(period - 1), dim1=-2, dim2=-1)`)",
            lambda: diagonal_mean(period, 0),
        ),
        (
            "your score reads the weight on i - period + 2, one position too far: the token "
            "after the previous occurrence is at i - period + 1",
            lambda: diagonal_mean(period - 2, 2) if period >= 2 else None,
        ),
        (
            "your score includes the query i = period - 1, whose token has not occurred before: "
            "average over i = period .. T - 1 only (drop the diagonal's first entry)",
            lambda: diagonal_mean(period - 1, 0),
        ),
        (
            "your score averages over all T query positions (positions without an earlier "
            "occurrence count as 0): average over i = period .. T - 1 only",
            lambda: diagonal_mean(period - 1, 1).mul(T - period).div(T),
        ),
        (
            "your score sums over the positions instead of averaging: take the mean over "
            "i = period .. T - 1 and the batch",
            lambda: (
                torch.diagonal(w, offset=-(period - 1), dim1=-2, dim2=-1)[..., 1:]
                .sum(dim=2)
                .mean(dim=0)
            ),
        ),
        (
            "your score sums over the batch and the positions: take the mean over "
            "i = period .. T - 1 and the batch",
            lambda: torch.diagonal(w, offset=-(period - 1), dim1=-2, dim2=-1)[..., 1:].sum(
                dim=(0, 2)
            ),
        ),
        (
            "your scores are per sequence, shape (B, H): average over the batch too (dim 0)",
            lambda: diagonal_mean(period - 1, 1, dims=(2,)),
        ),
        (
            "you averaged over the heads, shape (T - period,): keep one score per head and "
            "average over the batch and the query positions (dims 0 and 2)",
            lambda: diagonal_mean(period - 1, 1, dims=(0, 1)),
        ),
        (
            "these are the weights on i - 1 (the previous-token score): the induction offset "
            "is i - period + 1",
            lambda: diagonal_mean(1, 0) if period != 2 else None,
        ),
        (transposed_read, lambda: transposed() if period < T else None),
        (
            "your score uses T // 2 as the period: the sequences need not be two periods "
            f"long (here T = {T}, period = {period}); use the `period` argument",
            lambda: diagonal_mean(T // 2 - 1, 1) if T // 2 != period and T // 2 >= 1 else None,
        ),
        (
            "your score counts only the queries from T // 2 on: every query whose token has "
            "occurred before counts, i = period .. T - 1",
            lambda: diagonal_mean(period - 1, T // 2 - period + 1) if T // 2 > period else None,
        ),
        (
            "your score skips too many queries: the diagonal of offset -(period - 1) starts at "
            "query i = period - 1, so only its first entry goes (`[..., 1:]`), not `period` "
            "entries",
            lambda: diagonal_mean(period - 1, period) if period > 1 and 2 * period <= T else None,
        ),
        (
            "your score takes the max over the batch: average over the batch (dim 0) and the "
            "query positions",
            lambda: (
                torch.diagonal(w, offset=-(period - 1), dim1=-2, dim2=-1)[..., 1:]
                .mean(dim=2)
                .amax(dim=0)
            ),
        ),
        (
            "your score uses the first sequence of the batch only (`weights[0]`): average over "
            "the whole batch (dim 0) too",
            lambda: diagonal_mean(period - 1, 1, dims=(2,))[0] if w.shape[0] > 1 else None,
        ),
        (
            "you averaged over the heads instead of the batch, shape (B,): keep one score per "
            "head (dim 1) and average over the batch (dim 0) and the query positions",
            lambda: diagonal_mean(period - 1, 1, dims=(1, 2)),
        ),
    ]


def _induction_weights(kind: str, B: int, H: int, T: int, period: int, *, seed: int, dtype):
    if kind == "perfect":  # every query i >= period attends exactly to i - period + 1
        w = torch.zeros(B, H, T, T, dtype=dtype)
        w[..., 0, 0] = 1.0
        for i in range(1, T):
            w[..., i, i - period + 1 if i >= period else i - 1] = 1.0
        return w
    if kind == "uniform":  # uniform over the causal past: score = mean of 1 / (i + 1)
        w = torch.ones(T, T, dtype=dtype).tril()
        return (w / w.sum(dim=-1, keepdim=True)).expand(B, H, T, T).clone()

    def draw(name):
        return _weights(B, H, T, seed=name, causal=True, dtype=dtype)

    def first_is_not_the_best(w) -> bool:
        # "the first sequence only" and "the max over the batch" give the same scores when
        # sequence 0 is the batch's best on every head (about 1 draw in B ** H): redrawn
        # until some head's best sequence beats sequence 0 clearly, under every run seed
        per_sequence = diagonal(w).mean(dim=2)  # (B, H)
        return bool((per_sequence.amax(dim=0) - per_sequence[0]).max() > 1e-3)

    def diagonal(w):
        return torch.diagonal(w, offset=-(period - 1), dim1=-2, dim2=-1)[..., 1:].double()

    if B == 1 or period >= T:
        return draw(seed)
    return draw_until(draw, first_is_not_the_best, seed)


def _unambiguous(mistakes, expected: torch.Tensor):
    """The known mistakes, with those that give the same values on this case merged into
    one description that names them all: on a perfect induction head, for instance, the
    reads of i - period and of i - period + 2 both give 0, and naming one of them would be
    a guess. The first entry, the transposed-read probe, decides by itself when it fires."""
    computed = []
    for why, compute in mistakes:
        try:
            value = compute()
        except Exception:  # noqa: BLE001 - a mistake that cannot be computed does not match
            value = None
        if isinstance(value, torch.Tensor):
            value = value.detach()
            same_as_right = value.shape == expected.shape and torch.allclose(
                value.double(), expected.detach().double(), atol=1e-6, rtol=0
            )
            computed.append((why, None if same_as_right else value))
        else:
            computed.append((why, None))
    if computed and computed[0][1] is not None:  # the probe found a transposed read
        return [(computed[0][0], lambda v=computed[0][1]: v)]
    result = []
    for why, value in computed[1:]:
        if value is None:
            continue
        twins = []
        for other, v in computed[1:]:
            if (
                v is not None
                and other != why
                and other not in twins
                and v.shape == value.shape
                and torch.allclose(v.double(), value.double(), atol=1e-6, rtol=0)
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


def _induction_case(candidate, kind, B, H, T, period, *, seed=0, dtype=torch.float64, value=None):
    def run():
        w = _induction_weights(kind, B, H, T, period, seed=seed, dtype=dtype)
        expected = ref.induction_scores(w.clone(), period)
        what = f"induction_scores(weights {tuple(w.shape)} {str(dtype)[6:]}, period={period})"
        got = call_student(candidate, w, period, what=what, arg_names=["weights"])
        mistakes = _unambiguous(_induction_mistakes(w, period, candidate), expected)
        expect_close(got, expected, f"the scores of {what}", mistakes=mistakes)
        if value is not None:  # the case's closed form, stated in the message
            return value(expected)
        return None

    return run


@checker("induction_scores")
def check_induction_scores(candidate) -> list[Case]:
    """Check ``induction_scores(weights (B, H, T, T), period) -> (H,)``: the mean weight from
    query ``i`` to key ``i - period + 1`` over ``i = period .. T - 1`` and the batch."""
    return [
        Case(
            "a perfect induction head scores 1; B=2, H=3, T=12, period=5",
            _induction_case(candidate, "perfect", 2, 3, 12, 5),
            covers=frozenset({"B>1", "perfect"}),
            support=True,
        ),
        Case(
            "uniform causal weights, T=16, period=8",
            _induction_case(candidate, "uniform", 1, 2, 16, 8),
            covers=frozenset({"uniform"}),
            # a support case: its input is written out, not drawn, so its answer can be
            # known in advance (a table of the check cell's outputs passes it under any
            # seed), and a read of the wrong past position passes it too (a uniform row
            # gives every key up to the query the same weight)
            support=True,
        ),
        Case(
            "random causal weights, B=3, H=4, T=10, period=4",
            _induction_case(candidate, "random", 3, 4, 10, 4, seed=7),
            covers=frozenset({"B>1", "random"}),
        ),
        Case(
            "odd sizes: T=9 (not 2 * period), period=3, H=1",
            _induction_case(candidate, "random", 2, 1, 9, 3, seed=8),
            covers=frozenset({"B>1", "odd T"}),
        ),
        Case(
            "float32 weights keep float32",
            _induction_case(candidate, "random", 2, 2, 8, 4, seed=9, dtype=torch.float32),
            covers=frozenset({"B>1", "dtype=float32"}),
        ),
        Case(
            "period=1: every query i >= 1 is scored on itself",
            _induction_case(candidate, "random", 1, 2, 6, 1, seed=10),
            weight=TRIVIAL,
            covers=frozenset({"period=1"}),
        ),
    ]


# ================================================================ find the induction head
#
# The two "find it" tasks of exercise 17 run the student's function on chapter 17's trained
# model and recompute the answer. The model is the one shipped with the package
# (`interpret.load_induction_model()`, attention_course/assets/induction17.pt), never one
# trained here: 300 optimiser steps give slightly different weights on another CPU, BLAS
# or thread count, and with them, in a near tie, a different best head.

_PERIOD = 16
_TIE = 0.01  # heads whose induction scores are this close to the best are all accepted


def _trained():
    return ref.load_induction_model()


def _with_idle_layer(model, where: str):
    """The same function with a third layer that writes nothing (its ``w_o`` is zero, so
    the logits are unchanged), added at the ``"end"`` or the ``"start"``.

    At the end, the idle layer's heads copy layer 0's (they read the residual stream after
    both trained layers and score about 0.04); at the start they attend uniformly
    (``w_q = w_k = 0``). At the end, the best head is no longer in the last layer; at the
    start, it moves to layer 2: a function that scores one fixed layer (``weights[-1]``,
    ``weights[1]``) gives itself away."""
    from attention_course.gpt import GPT

    config = dict(ref.INDUCTION_CONFIG, num_layers=3)
    old = model.state_dict()
    sources = {"end": [0, 1, "idle"], "start": ["idle", 0, 1]}[where]
    state = {k: v for k, v in old.items() if not k.startswith("blocks.")}
    for i, source in enumerate(sources):
        block = {
            name.split(".", 2)[2]: value
            for name, value in old.items()
            if name.startswith(f"blocks.{0 if source == 'idle' else source}.")
        }
        if source == "idle":
            block = {k: v.clone() for k, v in block.items()}
            block["attn.w_o.weight"].zero_()  # writes nothing: the function is unchanged
            if where == "start":  # uniform causal weights
                block["attn.w_q.weight"].zero_()
                block["attn.w_k.weight"].zero_()
        state.update({f"blocks.{i}.{k}": v for k, v in block.items()})
    grown = GPT(**config)
    grown.load_state_dict(state)
    return grown.eval()


def _best_head_elsewhere(model):
    """The same function with an idle layer inserted between the two trained ones: its
    heads are four copies of layer 1's second-best head at period 16 (its ``w_o`` is zero,
    so it writes nothing and the logits are unchanged). It reads the residual stream that
    layer 1 reads, so each copy's weights are that head's: the idle layer's mean score is
    the second-best score, above layer 1's mean, while the best head stays in layer 1 (now
    layer 2). A function that picks the layer with the best mean score first, then its best
    head, answers (1, h) instead."""
    from attention_course.gpt import GPT

    ids = _eval_ids(_PERIOD)
    scores = _scores(model, ids, _PERIOD, _PERIOD - 1)[1]
    second = int(scores.argsort(descending=True)[1])
    Dh = model.d_model // model.num_heads
    rows = torch.cat([torch.arange(second * Dh, (second + 1) * Dh)] * model.num_heads)
    old = model.state_dict()
    state = {k: v for k, v in old.items() if not k.startswith("blocks.")}
    for i, source in enumerate([0, "copy", 1]):
        prefix = f"blocks.{1 if source == 'copy' else source}."
        block = {k[len(prefix) :]: v.clone() for k, v in old.items() if k.startswith(prefix)}
        if source == "copy":
            for name in ("attn.w_q", "attn.w_k", "attn.w_v"):
                block[f"{name}.weight"] = block[f"{name}.weight"][rows]
                if f"{name}.bias" in block:
                    block[f"{name}.bias"] = block[f"{name}.bias"][rows]
            block["attn.w_o.weight"].zero_()
        state.update({f"blocks.{i}.{k}": v for k, v in block.items()})
    grown = GPT(**dict(ref.INDUCTION_CONFIG, num_layers=3))
    grown.load_state_dict(state)
    return grown.eval()


def _twice_the_heads(model):
    """The same function with 8 heads per layer instead of 4: the residual stream is
    doubled, ``[x, x]`` (a LayerNorm of ``[x, x]`` is ``[LayerNorm(x), LayerNorm(x)]``),
    and every head appears twice, head ``h`` and head ``h + 4`` (same ``Dh``, so the same
    rotary positions and scaling). Each weight matrix becomes the 2 x 2 block matrix of
    halves that maps ``[x, x]`` to ``[Wx, Wx]``; the output head takes the mean of the two
    copies. The logits are those of the shipped model up to rounding, and a function that
    unflattens the (L, H) argmax with a hard-coded 4 heads gives itself away."""
    from attention_course.gpt import GPT

    def both(v):  # a vector of the residual stream's width
        return torch.cat([v, v])

    def square(w):  # (D, D) acting on [x, x] and giving [Wx, Wx]
        half = w / 2
        return torch.cat([torch.cat([half, half], dim=1)] * 2, dim=0)

    D = model.d_model
    state = {}
    for k, v in model.state_dict().items():
        if k == "tok_emb.weight":
            state[k] = torch.cat([v, v], dim=1)
        elif k == "head.weight":
            state[k] = torch.cat([v / 2, v / 2], dim=1)
        elif v.dim() == 2 and v.shape == (D, D):
            state[k] = square(v)
        elif v.dim() == 1 and v.shape[0] == D:
            state[k] = both(v)
        else:
            raise AssertionError(f"_twice_the_heads: unexpected weight {k} {tuple(v.shape)}")
    config = dict(ref.INDUCTION_CONFIG, d_model=2 * D, num_heads=2 * model.num_heads)
    wide = GPT(**config)
    wide.load_state_dict(state)
    return wide.eval()


def _eval_ids(period: int, seed: int = 1234, n: int = 32) -> torch.Tensor:
    """Chapter 17's evaluation batch for the shipped model. It does **not** follow the run
    seed (`_data.drawing_from`), unlike every other drawn input: the answers the checkers
    derive from the shipped model have margins far above rounding on this batch, proven by
    ``tests/test_determinism.py``, and on other batches they are not (the first sequence
    alone gives the batch's best head on most batches, and an ablation effect falls within
    the tolerance of its rounding to two decimals on some), so a fresh batch would make the
    verdict depend on the seed. The induction head is a property of the model, the same for
    any batch, so a fresh batch would not stop a table of answers either. What follows the
    run seed instead is the numbering of the heads (`_renumbering`): the same function, so
    the same margins, and an answer keyed on (layer, head) is wrong."""
    from attention_course.data.repeated import repeated_tokens

    return repeated_tokens(n, period, 32, torch.Generator().manual_seed(seed))


def _permute_heads(model, layer: int, order: list[int]):
    """The same function with the heads of ``layer`` renumbered: new head k is old
    head ``order[k]`` (rows of w_q, w_k, w_v and columns of w_o moved together)."""
    attn = model.blocks[layer].attn
    Dh = model.d_model // model.num_heads
    idx = torch.cat([torch.arange(h * Dh, (h + 1) * Dh) for h in order])
    with torch.no_grad():
        for lin in (attn.w_q, attn.w_k, attn.w_v):
            lin.weight.copy_(lin.weight[idx])
        attn.w_o.weight.copy_(attn.w_o.weight[:, idx])
    return model


class _Renumbering(NamedTuple):
    """New head k of layer l is old head ``orders[l][k]``; its query weights are then
    multiplied by ``2 ** a`` and its key weights by ``2 ** -a``, its value weights by
    ``2 ** b`` and its columns of w_o by ``2 ** -b``, where ``(a, b) = exponents[l][k]``."""

    orders: list[list[int]]
    exponents: list[list[tuple[int, int]]]


def _renumbering(num_layers: int, num_heads: int, *, seed: int, keep=None) -> _Renumbering:
    """A renumbering of the heads of every layer, and a rescaling of each head's weights,
    drawn from the run seed (the input named ``seed``, `_data.generator`). No head keeps its
    number in any layer (each order is a derangement), and ``keep(orders)``, when given,
    accepts the orders (`_data.draw_until` redraws until it does).

    It is the same function: renumbering heads moves their rows and columns together
    (`_permute_heads`; the sums in w_o add in another order, float32 rounding, about 1e-6
    of the logits), and scaling a head's queries by 2 ** a and its keys by 2 ** -a leaves
    every product q . k bit for bit the same (a power of two is exact in floating point;
    likewise values and w_o). So every answer the checks derive keeps the margins proven
    on the shipped model (``tests/test_determinism.py``, ``tests/test_lookup17.py``). Only
    the numbers and the stored weights change: an answer keyed on (layer, head) of the
    shipped model, or on the weights of the check cell's models, is wrong on the grader's
    fresh seed (81 orders of 2 x 4 heads alone would be few enough to record them all; with
    the exponents, each in -3 .. 3, there are about 10^15 models)."""

    def draw(name: int) -> _Renumbering:
        g = generator(name)
        orders = []
        for _ in range(num_layers):
            for _ in range(1000):  # a random order is a derangement 3 times in 8
                order = torch.randperm(num_heads, generator=g).tolist()
                if all(old != new for new, old in enumerate(order)):
                    break
            orders.append(order)
        drawn = torch.randint(-3, 4, (num_layers, num_heads, 2), generator=g).tolist()
        exponents = [[(a, b) for a, b in layer] for layer in drawn]
        return _Renumbering(orders, exponents)

    def accepted(renumbering: _Renumbering) -> bool:
        orders = renumbering.orders
        deranged = all(old != new for order in orders for new, old in enumerate(order))
        return deranged and (keep is None or keep(orders))

    return draw_until(draw, accepted, seed)


def _renumbered(model, renumbering: _Renumbering):
    """``model`` with its heads renumbered and rescaled by ``renumbering``: the same
    function (`_renumbering`)."""
    Dh = model.d_model // model.num_heads
    for layer, order in enumerate(renumbering.orders):
        _permute_heads(model, layer, order)
        attn = model.blocks[layer].attn
        with torch.no_grad():
            for k, (a, b) in enumerate(renumbering.exponents[layer]):
                rows = slice(k * Dh, (k + 1) * Dh)
                attn.w_q.weight[rows] *= 2.0**a  # q . k unchanged: 2 ** a * 2 ** -a = 1
                attn.w_k.weight[rows] *= 2.0**-a
                attn.w_v.weight[rows] *= 2.0**b  # w_o (v): each product unchanged
                attn.w_o.weight[:, rows] *= 2.0**-b
    return model


def _describe_renumbering(renumbering: _Renumbering) -> str:
    layers = "; ".join(f"layer {layer}: {order}" for layer, order in enumerate(renumbering.orders))
    return (
        "on the same model with the heads of every layer renumbered at random and their "
        "weights rescaled by powers of two that cancel, the same function (new head k is "
        f"old head order[k]; {layers})"
    )


def _variant(name: str):
    model = _trained()
    if name == "permuted":
        _permute_heads(model, 1, [2, 3, 0, 1])
        _permute_heads(model, 0, [1, 0, 3, 2])
    if name in ("idle layer at the end", "idle layer at the start"):
        model = _with_idle_layer(model, name.rsplit(" ", 1)[1])
    if name == "best head outside the best-mean layer":
        model = _best_head_elsewhere(model)
    if name == "8 heads":
        model = _twice_the_heads(model)
    if name == "harmful":  # head (1, 0)'s output negated: it now hurts, removing it helps
        Dh = model.d_model // model.num_heads
        with torch.no_grad():
            model.blocks[1].attn.w_o.weight[:, :Dh].neg_()
    return model


def _scores(model, ids, period, offset):
    with torch.no_grad():
        _, weights = model(ids, return_attention=True)
    rows = []
    for w in weights:
        d = torch.diagonal(w, offset=-offset, dim1=-2, dim2=-1)
        rows.append(d[..., 1:].mean(dim=(0, 2)) if offset == period - 1 else d.mean(dim=(0, 2)))
    return torch.stack(rows)  # (L, H)


def _as_layer_head(got, what: str) -> tuple[int, int]:
    from numbers import Integral

    def integer(v):  # Python and numpy ints, and one-element integer tensors, all count
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            if v.dtype.is_floating_point or v.dtype.is_complex or v.dtype == torch.bool:
                return v
            return int(v.item())
        return v

    if isinstance(got, torch.Tensor) and got.numel() == 2 and not got.dtype.is_floating_point:
        got = tuple(int(v) for v in got.reshape(-1).tolist())
    if isinstance(got, (tuple, list)):
        got = tuple(integer(v) for v in got)
    if isinstance(got, (tuple, list)) and any(isinstance(v, bool) for v in got):
        raise CaseFailed(
            f"{what} returned {got!r}: expected a tuple (layer, head) of two ints, and "
            "True/False are truth values, not indices (Python counts a bool as an int, the "
            "check does not): return the indices themselves, e.g. `int(layer), int(head)`"
        )
    if (
        not isinstance(got, (tuple, list))
        or len(got) != 2
        or not all(isinstance(v, Integral) and not isinstance(v, bool) for v in got)
    ):
        raise CaseFailed(f"{what} returned {got!r}: expected a tuple (layer, head) of two ints")
    return int(got[0]), int(got[1])


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _expect_unchanged(model, before, what):
    for k, v in model.state_dict().items():
        if not torch.equal(v, before[k]):
            raise CaseFailed(
                f"{what} left the model changed ({k}): restore every weight you zero (copy it "
                "first and put it back, or use `with ablate_heads(...)`-style code that does)"
            )


def _accepted(model, ids, period):
    """The (L, H) induction scores and the heads within `_TIE` of the best: the answers
    accepted. Several layer-2 heads of this model are induction heads, and two of them can
    score within a few thousandths of each other (period 12: 0.676 and 0.674): every head
    within _TIE of the best is accepted, as the task says."""
    induction = _scores(model, ids, period, period - 1)
    near_best = (induction.flatten() >= induction.max() - _TIE).nonzero()
    return induction, [divmod(int(k), model.num_heads) for k in near_best]


def _find_case(candidate, variant: str, period: int, renumber: int | None = None):
    """The case on ``variant``; with ``renumber`` (the name of a drawn input), on that model
    with the heads of every layer renumbered by `_renumbering`, drawn so that no answer
    accepted before the renumbering is accepted after it."""

    def run():
        model = _variant(variant)
        ids = _eval_ids(period)
        if renumber is None:
            return judge(model, ids, stale=None)
        _, stale = _accepted(model, ids, period)
        renumbering = _renumbering(
            model.num_layers,
            model.num_heads,
            seed=renumber,
            keep=lambda orders: all(
                orders[layer][head] not in {h for l, h in stale if l == layer}
                for layer, head in stale
            ),
        )
        try:
            return judge(_renumbered(model, renumbering), ids, stale=stale)
        except CaseFailed as failure:
            raise CaseFailed(f"{_describe_renumbering(renumbering)}: {failure}") from None

    def judge(model, ids, stale):
        L, H = model.num_layers, model.num_heads
        # The expected answer is recomputed on the very model passed to the student's
        # function.
        induction, accepted = _accepted(model, ids, period)
        expected = ref.find_induction_head(model, ids, period)
        before = _state(model)
        what = f"find_induction_head(model, ids, period={period})"
        got = _as_layer_head(call_student(candidate, model, ids, period, what=what), what)
        _expect_unchanged(model, before, what)
        if got in accepted:
            return None
        previous = _scores(model, ids, period, 1)
        duplicate = _scores(model, ids, period, period)
        message = f"{what} returned {got}, expected {expected} (0-based layer, head)"
        if len(accepted) > 1:
            message += f" or any of {accepted} (within {_TIE} of the best score)"
        if stale is not None and got in stale:
            # first: the renumbering is drawn so that this is never right, and an answer
            # that does not follow it was not computed from this model
            raise CaseFailed(
                f"{message}: {got} is the answer for this model before its heads were "
                "renumbered.\nLikely mistake: an answer fixed in advance or recorded on "
                "another model (a table of answers): compute the scores from the model and "
                "the ids you are given"
            )
        flat = int(induction.argmax())
        one_based = (expected[0] + 1, expected[1])
        by_layers = divmod(flat, L)  # the flat argmax unflattened with the number of layers
        in_range = 0 <= got[0] < L and 0 <= got[1] < H
        lowest = in_range and bool(induction[got] <= induction.min() + 1e-6)
        if got == one_based and got == by_layers:
            raise CaseFailed(
                f"{message}: layer {got[0]} does not exist (the model has {L} layers, "
                f"0 .. {L - 1}).\nLikely mistake: layers counted from 1 (layers are 0-based: "
                "model.blocks[layer]), or the flat argmax of the (L, H) scores unflattened "
                "with the number of layers: `divmod(index, num_heads)` gives (layer, head)"
            )
        if got == (expected[1], expected[0]) and lowest:
            raise CaseFailed(
                f"{message}.\nLikely mistake: the answer is (layer, head), in that order; or "
                "you took the argmin (that head has the *lowest* induction score)"
            )
        if got == (expected[0] + 1, expected[1] + 1):
            raise CaseFailed(
                f"{message}.\nLikely mistake: layers and heads counted from 1; both are "
                "0-based (`model.blocks[layer]`, head 0 is the first)"
            )
        if flat >= H and got[1] == flat and got[0] in (0, expected[0]):
            raise CaseFailed(
                f"{message}: head {got[1]} does not exist (the model has {H} heads per "
                f"layer).\nLikely mistake: {flat} is the flat index of the best score in the "
                "(L, H) table, not a head: `divmod(index, num_heads)` gives (layer, head)"
            )
        if H != 4 and got == divmod(flat, 4):
            raise CaseFailed(
                f"{message}: this model has {H} heads per layer.\nLikely mistake: the flat "
                "argmax unflattened with a hard-coded 4 heads: use the number of heads of "
                "the model you are given (`model.num_heads` or the scores' `shape[1]`)"
            )
        T = ids.shape[1]
        wrong_period = [
            (divmod(int(_scores(model, ids, p, p - 1).argmax()), H), p)
            for p in (_PERIOD,)
            if p != period and p < T
        ]
        for answer, p in wrong_period:
            if got == answer:
                raise CaseFailed(
                    f"{message}.\nLikely mistake: your answer is the one for period {p}: score "
                    "with the `period` argument, not a fixed value"
                )
        best_mean = int(induction.mean(dim=1).argmax())
        if best_mean != expected[0] and got == (best_mean, int(induction[best_mean].argmax())):
            raise CaseFailed(
                f"{message}: layer {best_mean} has the highest mean score, but the best single "
                f"head is in layer {expected[0]}.\nLikely mistake: you chose the layer with "
                "the best mean score, then its best head: take the argmax over every "
                "(layer, head) score at once"
            )
        named = [
            (
                divmod(int(previous.argmax()), H),
                "that is the previous-token head (weight on i - 1), the partner in layer 0: "
                "the induction head has the highest weight on i - period + 1",
            ),
            (
                divmod(int(duplicate.argmax()), H),
                "that head has the highest weight on i - period (off by one): the induction "
                "head attends to the token *after* the previous occurrence, i - period + 1",
            ),
            (one_based, "layers are 0-based: model.blocks[layer]"),
            (
                divmod(int(_scores(model, ids[:1], period, period - 1).argmax()), H),
                "you scored the first sequence only (`weights[0]`, `ids[0]` or a "
                "`[0]` index on the batch): average each head's score over the whole batch",
            ),
            (
                by_layers,
                "you unflattened the argmax of the (L, H) scores with the number of layers; "
                "`divmod(index, num_heads)` gives (layer, head)",
            ),
            (
                got if lowest else None,
                "that head has the *lowest* induction score: take the argmax, not the argmin",
            ),
            ((expected[1], expected[0]), "the answer is (layer, head), in that order"),
        ]
        for answer, why in named:
            if got == answer:
                raise CaseFailed(f"{message}.\nLikely mistake: {why}")
        for k in range(2, L):  # the first k layers only, e.g. a hard-coded range(2)
            if expected[0] >= k and got == divmod(int(induction[:k].argmax()), H):
                raise CaseFailed(
                    f"{message}: this model has {L} layers, and its best head is in layer "
                    f"{expected[0]}.\nLikely mistake: you scanned only layers 0 .. {k - 1} "
                    f"(a fixed `range({k})`?): score every layer of `weights` (len(weights) "
                    "or model.num_layers) and take the argmax over all of them"
                )
        if in_range and got[0] != expected[0]:
            within = induction[got[0]]  # the best head of one layer only
            if bool(within[got[1]] >= within.max() - 1e-6):
                which = "the last layer (`weights[-1]`)" if got[0] == L - 1 else f"layer {got[0]}"
                raise CaseFailed(
                    f"{message}: this model has {L} layers, and its best head is in layer "
                    f"{expected[0]}.\nLikely mistake: you scanned only {which}: score the "
                    "heads of every layer (one (H,) row per layer of `weights`, stacked "
                    "to (L, H)) and take the argmax over all of them"
                )
        if not in_range:
            raise CaseFailed(f"{message}: the model has {L} layers of {H} heads (0-based)")
        if variant == "permuted" and got == ref.find_induction_head(_trained(), ids, period):
            raise CaseFailed(
                f"{message}: the heads of this model are renumbered, and {got} is the answer "
                "for the model before renumbering.\nLikely mistake: an answer fixed in "
                "advance; compute the scores from the model and the ids"
            )
        raise CaseFailed(f"{message}.\nHint: score every head with induction_scores and argmax")

    return run


def _find_pair_case(candidate, variant: str, period: int, renumber: int):
    """`_find_case` on ``variant``, then on its twin with the heads of every layer renumbered
    at random (`_renumbering`, drawn from the run seed with the input name ``renumber``):
    the best head moves, so no fixed (layer, head) passes both (issue #27: a memorised
    answer earns no credit), and a table of answers recorded on the check cell's models
    fails in the grader, whose run seed draws another renumbering (issue #25)."""
    first, twin = (
        _find_case(candidate, variant, period),
        _find_case(candidate, variant, period, renumber=renumber),
    )

    def run():
        first()
        twin()

    return run


@checker("find_induction_head")
def check_find_induction_head(candidate) -> list[Case]:
    """Check ``find_induction_head(model, ids, period) -> (layer, head)`` on chapter 17's
    trained attention-only model (shipped with the package), grown by an idle layer in two
    cases: the 0-based head with the highest induction score. Each case also asks again on
    the same model with its heads renumbered at random (drawn from the run seed), so no
    fixed answer passes a case, and answers recorded on the check cell's models fail in
    the grader."""
    _trained()  # reads the file once per process (outside the cases' time limit)
    return [
        Case(
            "chapter 17's trained model, period 16",
            _find_pair_case(candidate, "trained", _PERIOD, renumber=1701),
            covers=frozenset({"trained"}),
        ),
        Case(
            "the same model with its heads renumbered",
            _find_pair_case(candidate, "permuted", _PERIOD, renumber=1702),
            covers=frozenset({"permuted"}),
        ),
        Case(
            "another period (12)",
            _find_pair_case(candidate, "trained", 12, renumber=1703),
            covers=frozenset({"period"}),
        ),
        Case(
            "the shortest period of training (10)",
            _find_pair_case(candidate, "trained", 10, renumber=1704),
            covers=frozenset({"period"}),
        ),
        Case(
            "the longest period of training (20), heads renumbered",
            _find_pair_case(candidate, "permuted", 20, renumber=1705),
            covers=frozenset({"period", "permuted"}),
        ),
        Case(
            "the same model with a third layer that writes nothing, appended: the best head "
            "is not in the last layer",
            _find_pair_case(candidate, "idle layer at the end", _PERIOD, renumber=1706),
            covers=frozenset({"best head not in the last layer"}),
        ),
        Case(
            "the same model with a first layer that attends uniformly and writes nothing: "
            "the best head is in layer 2 of 3",
            _find_pair_case(candidate, "idle layer at the start", _PERIOD, renumber=1707),
            covers=frozenset({"best head not in layer 1"}),
        ),
        Case(
            "the same model with an idle middle layer of four copies of layer 1's "
            "second-best head: the layer with the best mean score does not hold the best head",
            _find_pair_case(
                candidate, "best head outside the best-mean layer", _PERIOD, renumber=1708
            ),
            covers=frozenset({"best head not in the best-mean layer"}),
        ),
        Case(
            "the same model with 8 heads per layer (twice as wide, every head duplicated: "
            "the same function)",
            _find_pair_case(candidate, "8 heads", _PERIOD, renumber=1709),
            covers=frozenset({"H != 4"}),
        ),
    ]


def _ablation_mistakes(model, ids, period, layer, head):
    import torch.nn.functional as F

    def full_loss():
        logits = model(ids)
        V = logits.shape[-1]
        return F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1)).item()

    def loss_from(start):
        logits = model(ids)
        V = logits.shape[-1]
        return F.cross_entropy(
            logits[:, start:-1].reshape(-1, V), ids[:, start + 1 :].reshape(-1)
        ).item()

    with torch.no_grad():
        before = ref.second_half_loss(model, ids, period).item()
        full_before, from_before = full_loss(), loss_from(period - 1)
        with ref.ablate_heads(model, [(layer, head)]):
            after = ref.second_half_loss(model, ids, period).item()
            full_after, from_after = full_loss(), loss_from(period - 1)
        with ref.ablate_heads(model, [(layer, h) for h in range(model.num_heads)]):
            layer_after = ref.second_half_loss(model, ids, period).item()
        w_o = model.blocks[layer].attn.w_o.weight
        Dh = model.d_model // model.num_heads
        saved = w_o.data[head * Dh : (head + 1) * Dh].clone()
        w_o.data[head * Dh : (head + 1) * Dh] = 0.0  # rows: output features, not the head
        rows_after = ref.second_half_loss(model, ids, period).item()
        w_o.data[head * Dh : (head + 1) * Dh] = saved
        w_q = model.blocks[layer].attn.w_q.weight
        saved = w_q.data[head * Dh : (head + 1) * Dh].clone()
        w_q.data[head * Dh : (head + 1) * Dh] = 0.0  # the head's queries: it attends uniformly
        queries_after = ref.second_half_loss(model, ids, period).item()
        w_q.data[head * Dh : (head + 1) * Dh] = saved
        wrong_dh = model.d_model // model.num_layers  # Dh from the number of layers
        saved = w_o.data[:, head * wrong_dh : (head + 1) * wrong_dh].clone()
        w_o.data[:, head * wrong_dh : (head + 1) * wrong_dh] = 0.0
        wrong_dh_after = ref.second_half_loss(model, ids, period).item()
        w_o.data[:, head * wrong_dh : (head + 1) * wrong_dh] = saved
        first = ids[:1]
        first_before = ref.second_half_loss(model, first, period).item()
        with ref.ablate_heads(model, [(layer, head)]):
            first_after = ref.second_half_loss(model, first, period).item()
    L, H = model.num_layers, model.num_heads

    def effect(l: int, h: int):
        if (l, h) == (layer, head) or not (0 <= l < L and 0 <= h < H):
            return None
        return ref.ablation_effect(model, ids, period, l, h)

    return [
        (
            "the change here is negative (this head's output is negated, so it hurts and "
            "removing it lowers the loss), and your value has the opposite sign: return "
            "after - before with its sign, no abs()",
            abs(after - before) if after < before else None,
        ),
        (
            "the sign is reversed: return the loss with the head ablated minus the loss of "
            "the intact model (positive when the head helps)",
            before - after,
        ),
        ("you returned the ablated loss itself, not its change", after),
        ("you returned the intact loss, not the change", before),
        (
            "you measured the loss on the whole sequence; the task's loss is on the "
            "predictable second half (logits period .. 2 period - 2)",
            full_after - full_before,
        ),
        (
            "your loss includes the prediction of token `period` (logit period - 1), which no "
            "head can predict: start at logit `period`",
            from_after - from_before,
        ),
        (
            "you ablated every head of the layer: zero only head `head`'s columns of w_o",
            layer_after - before,
        ),
        (
            "you zeroed rows head*Dh:(head+1)*Dh of w_o.weight (output features), not its "
            "columns: the head's output is read by w_o.weight[:, head*Dh:(head+1)*Dh]",
            rows_after - before,
        ),
        ("you returned the ratio after / before, not the difference", after / before),
        ("you returned log(after / before), not the difference", math.log(after / before)),
        (
            'your losses are sums over the predicted tokens (`reduction="sum"`), not means: '
            "use second_half_loss, the mean cross-entropy",
            (after - before) * ids.shape[0] * (period - 1),
        ),
        (
            "your change is in bits (divided by ln 2): the task's loss is in nats, "
            "cross-entropy with the natural log",
            (after - before) / math.log(2),
        ),
        (
            "your value is the effect of ablating the same head in layer "
            f"{layer - 1}: layers are 0-based (model.blocks[layer])",
            ref.ablation_effect(model, ids, period, layer - 1, head) if layer >= 1 else None,
        ),
        (
            f"your value is the effect of ablating head {head + 1} of layer {layer}: heads "
            "are 0-based, head `head` is read by columns head*Dh .. (head+1)*Dh of w_o",
            effect(layer, head + 1),
        ),
        (
            f"your value is the effect of ablating layer {head}, head {layer}: (layer, head) "
            "are swapped; `model.blocks[layer]` and `ablate_heads(model, [(layer, head)])`",
            effect(head, layer),
        ),
        (
            f"your value is the effect of ablating head {head} of the last layer ({L - 1}): "
            "use the `layer` argument, `model.blocks[layer]`",
            effect(L - 1, head),
        ),
        (
            "you zeroed the head's rows of w_q (its queries, so it attends uniformly), not its "
            "output: zero the columns head*Dh .. (head+1)*Dh of `attn.w_o.weight`",
            queries_after - before,
        ),
        (
            f"you zeroed columns of width d_model // num_layers = {wrong_dh}: a head's width "
            f"is Dh = d_model // num_heads = {Dh}",
            wrong_dh_after - before if wrong_dh != Dh and head * wrong_dh < Dh * H else None,
        ),
        (
            "you measured on the first sequence only (`ids[0]` or `ids[:1]`): use the whole "
            "batch `ids`",
            first_after - first_before,
        ),
        (
            "your change is 0: both losses were taken with the head in the same state (for "
            "example both inside the `with ablate_heads(...)` block, or the columns zeroed "
            "after the second measurement); measure the intact loss outside the block and the "
            "ablated loss inside it; or the columns you zeroed lie beyond w_o's width "
            "(a head's width is Dh = d_model // num_heads)",
            0.0,
        ),
    ]


def _as_real_number(got, what: str) -> float:
    """``got`` as a float if it is one real number: a Python int or float, a numpy scalar
    (or 0-d array) or a 0-d tensor of a real dtype. Anything else (a string, a bool, a
    list, a one-element tensor of shape (1,), ...) fails with the type expected."""
    if isinstance(got, torch.Tensor):
        ok = got.dim() == 0 and not _non_real(got.dtype)
        if ok:
            return float(got.item())
        shape = tuple(got.shape)
        kind = f"a tensor of shape {shape} ({str(got.dtype)[6:]})"
    elif type(got).__module__ == "numpy" and hasattr(got, "dtype"):
        ok = getattr(got, "ndim", 0) == 0 and got.dtype.kind in "iuf"
        if ok:
            return float(got.item())
        kind = f"a numpy {type(got).__name__} of shape {getattr(got, 'shape', ())}"
    elif isinstance(got, (int, float)) and not isinstance(got, bool):
        return float(got)
    else:
        kind = f"a {type(got).__name__}"
    shown = repr(got)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise CaseFailed(
        f"{what} returned {kind}, {shown}: expected one real number, a float (nats): return "
        "a Python float, e.g. `.item()` of a 0-d tensor (not a string, a list, a bool or a "
        "one-element tensor of shape (1,))"
    )


def _non_real(dtype) -> bool:
    return dtype == torch.bool or dtype.is_complex


def _ablation_target(model, ids, which: str) -> tuple[int, int]:
    if which == "induction":
        return ref.find_induction_head(model, ids, _PERIOD)
    if which == "previous":  # the previous-token head of layer 0
        return 0, int(_scores(model, ids, _PERIOD, 1)[0].argmax())
    layer, head = (int(v) for v in which.split(","))  # a fixed (layer, head), e.g. "1,3"
    return layer, head


def _close(value: float, target: float) -> bool:
    return abs(value - target) <= 1e-3 + 1e-3 * abs(target)


def _ablation_case(candidate, variant: str, which: str, renumber: int | None = None):
    """The case on ``variant``; with ``renumber`` (the name of a drawn input), the same head
    asked for again on that model with the heads of every layer renumbered by
    `_renumbering`: the head keeps its effect and gets another number."""

    def run():
        model = _variant(variant)
        ids = _eval_ids(_PERIOD)
        layer, head = _ablation_target(model, ids, which)
        # the models an answer keyed on (layer, head) could have been recorded on
        others = [] if variant == "trained" else [(_trained(), "chapter 17's model as shipped")]
        if renumber is None:
            return judge(model, ids, layer, head, others)
        renumbering = _renumbering(model.num_layers, model.num_heads, seed=renumber)
        others.insert(0, (_variant(variant), "this model before its heads were renumbered"))
        new = renumbering.orders[layer].index(head)
        try:
            return judge(_renumbered(model, renumbering), ids, layer, new, others)
        except CaseFailed as failure:
            raise CaseFailed(
                f"{_describe_renumbering(renumbering)}, where old head {head} of layer {layer} is "
                f"now head {new}: {failure}"
            ) from None

    def judge(model, ids, layer, head, others):
        expected = ref.ablation_effect(model, ids, _PERIOD, layer, head)
        before = _state(model)
        what = f"ablation_effect(model, ids, period={_PERIOD}, layer={layer}, head={head})"
        got = call_student(candidate, model, ids, _PERIOD, layer, head, what=what)
        _expect_unchanged(model, before, what)
        value = _as_real_number(got, what)
        if _close(value, expected):
            return None
        message = f"{what} returned {value:.4f}, expected {expected:.4f} nats"
        model.load_state_dict(before)
        for other, name in others:  # first: never right here (test_lookup17.py: margins)
            if _close(value, ref.ablation_effect(other, ids, _PERIOD, layer, head)):
                raise CaseFailed(
                    f"{message}: your value is the effect of ablating head ({layer}, {head}) of "
                    f"{name}, not of the model you are given.\nLikely mistake: a "
                    "value fixed in advance or recorded on another model (a table keyed on "
                    "(layer, head)): zero that head's columns of w_o in the model you are "
                    "given and measure the loss"
                )
        for why, wrong in _ablation_mistakes(model, ids, _PERIOD, layer, head):
            if wrong is not None and _close(value, wrong):
                raise CaseFailed(f"{message}.\nLikely mistake: {why}")
        for digits in (0, 1, 2):
            if abs(value - round(expected, digits)) < 1e-9:
                raise CaseFailed(
                    f"{message}.\nLikely mistake: your value is rounded to {digits} "
                    "decimal(s): return the difference unrounded (round only when printing)"
                )
        raise CaseFailed(
            f"{message}.\nHint: zero w_o.weight[:, head*Dh:(head+1)*Dh] of that layer, take "
            "second_half_loss, restore the weights, subtract the intact loss"
        )

    return run


def _ablation_pair_case(candidate, variant: str, which: str, renumber: int):
    """`_ablation_case` on ``variant``, then on its twin with the heads of every layer
    renumbered at random (`_renumbering`, drawn from the run seed with the input name
    ``renumber``), asking for the same head under its new number: a value keyed on
    (layer, head), of the shipped model or of the check cell's models, fails (issue #25)."""
    first, twin = (
        _ablation_case(candidate, variant, which),
        _ablation_case(candidate, variant, which, renumber=renumber),
    )

    def run():
        first()
        twin()

    return run


@checker("ablation_effect")
def check_ablation_effect(candidate) -> list[Case]:
    """Check ``ablation_effect(model, ids, period, layer, head) -> float``: the second-half
    loss with that head's output zeroed minus the intact loss, the model left unchanged.
    Each case also asks again for the same head on the same model with its heads renumbered
    at random (drawn from the run seed), so no value keyed on (layer, head) passes a case."""
    _trained()  # reads the file once per process (outside the cases' time limit)
    return [
        Case(
            "ablating the induction head of chapter 17's model",
            _ablation_pair_case(candidate, "trained", "induction", renumber=1721),
            covers=frozenset({"induction head"}),
        ),
        Case(
            "ablating the previous-token head",
            _ablation_pair_case(candidate, "trained", "previous", renumber=1722),
            covers=frozenset({"previous-token head"}),
        ),
        Case(
            "the model with its heads renumbered",
            _ablation_pair_case(candidate, "permuted", "induction", renumber=1723),
            covers=frozenset({"permuted"}),
        ),
        Case(
            "ablating layer 1, head 3",
            _ablation_pair_case(candidate, "trained", "1,3", renumber=1724),
            covers=frozenset({"other head"}),
        ),
        Case(
            "ablating layer 0, head 2",
            _ablation_pair_case(candidate, "trained", "0,2", renumber=1725),
            covers=frozenset({"other head"}),
        ),
        Case(
            "a head that hurts (layer 1, head 0 with its output negated): removing it lowers "
            "the loss, so the change is negative",
            _ablation_pair_case(candidate, "harmful", "1,0", renumber=1726),
            covers=frozenset({"negative change"}),
        ),
    ]
