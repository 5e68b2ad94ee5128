"""Checker for ``attention_rollout(attentions) -> (B, T, T)`` (Abnar & Zuidema, 2020):
per layer the head mean plus the identity, rows renormalised, multiplied from the last
layer down to the first."""

from __future__ import annotations

import torch

from attention_course import interpret as ref

from ._compare import expect_close, sums_to_one_hint
from ._data import leaf, randn
from ._modules import expect_same_grads
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
            "your rollout adds the identity but does not renormalise the rows: divide "
            "head mean + I by its row sums (each row then sums to 1, the paper's 0.5 W + 0.5 I)",
            rollout(renorm="none"),
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


def _grad_case(candidate):
    # The gradients are compared with respect to the *scores* the weights come from
    # (weights = softmax(scores)), as in a real model. With respect to the weights
    # themselves, correct forms differ by a per-row constant (e.g. the paper's
    # 0.5 W + 0.5 I vs renormalising W + I), which a softmax removes.
    def run():
        scores = [randn(1, 2, 4, 4, seed=31) * 1.5, randn(1, 3, 4, 4, seed=32) * 1.5]
        mine, theirs = [leaf(s) for s in scores], [leaf(s) for s in scores]
        attentions = [s.softmax(dim=-1) for s in mine]
        expected = ref.attention_rollout([s.softmax(dim=-1) for s in theirs])
        got = call_student(candidate, attentions, what=_describe(attentions))
        expect_close(got, expected, "the rollout", mistakes=_mistakes(attentions))
        expect_same_grads(
            got,
            expected,
            {
                f"the scores behind `attentions[{i}]`": (m, t)
                for i, (m, t) in enumerate(zip(mine, theirs))
            },
        )

    return run


@checker("attention_rollout")
def check_attention_rollout(candidate) -> list[Case]:
    """Check ``attention_rollout(attentions) -> (B, T, T)``: per layer the head mean plus
    the identity, rows renormalised, multiplied from the last layer down to the first."""
    return [
        Case(
            "one layer, H=2, T=4: R = (head mean + I), rows renormalised",
            _compare_case(candidate, lambda: [_weights(1, 2, 4, seed=1)]),
            covers=frozenset({"L=1"}),
        ),
        Case(
            "two layers, H=2, T=5: R = A_2 @ A_1",
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
        ),
        Case(
            "T=1: a single token",
            _compare_case(candidate, lambda: [torch.ones(2, 2, 1, 1, dtype=torch.float64)] * 2),
            weight=TRIVIAL,
            covers=frozenset({"T=1", "B>1"}),
        ),
        Case(
            "gradients flow to every layer's weights",
            _grad_case(candidate),
            covers=frozenset({"grad", "L>1"}),
        ),
    ]
