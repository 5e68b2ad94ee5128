"""Checkers for chapter 2-4 targets: soft-argmax, set attention, scaled
dot-product attention and additive (Bahdanau) attention."""

from __future__ import annotations

import math

import torch

from attention_course import attention as ref

from ._compare import (
    Mistake,
    expect_close,
    expect_like,
    expect_tuple,
    fmt_shape,
    sums_to_one_hint,
    tolerances,
)
from ._data import draw_until, leaf, randn, random_bool
from ._dropout import expect_dropout_of, is_unchanged, looks_dropped_out
from ._mistakes import says
from ._modules import ModulePair, expect_same_grads, leaves
from ._runner import TRIVIAL, Case, CaseFailed, call_student, checker
from ._weights import attend, expect_weights_then_output

# ---------------------------------------------------------------- soft_argmax


def _kwargs_text(kwargs: dict) -> str:
    return "".join(f", {k}={v!r}" for k, v in kwargs.items())


def _soft_argmax_mistakes(scores: torch.Tensor, beta: float, dim: int) -> list[Mistake]:
    scaled = beta * scores
    d = dim % scores.dim()
    mistakes: list[Mistake] = []
    if d != scores.dim() - 1:
        mistakes.append(
            (
                f"you ignored `dim` and normalised over the last axis: the weights must sum "
                f"to 1 along dim={dim}",
                lambda: torch.softmax(scaled, dim=-1),
            )
        )
    for other in range(scores.dim()):
        if other != d:
            mistakes.append(
                (
                    f"your softmax runs over dim={other}: the weights must sum to 1 along "
                    f"dim={dim}",
                    lambda other=other: torch.softmax(scaled, dim=other),
                )
            )
    if beta != 1.0:
        mistakes += [
            (
                "`beta` is ignored: soft_argmax is softmax(beta * scores)",
                lambda: torch.softmax(scores, dim=dim),
            ),
            (
                "you divided the scores by beta: soft_argmax is softmax(beta * scores), "
                "beta multiplies",
                lambda: torch.softmax(scores / beta, dim=dim),
            ),
            (
                "beta multiplies the weights after the softmax: it must multiply the scores "
                "before it",
                lambda: beta * torch.softmax(scores, dim=dim),
            ),
        ]
    mistakes += [
        (
            "exp overflows (or underflows to 0/0) for large scores: subtract the max along "
            "`dim` before exponentiating (softmax does not change when all scores shift)",
            lambda: torch.exp(scaled) / torch.exp(scaled).sum(dim, keepdim=True),
        ),
        (
            "the exponentials are not normalised: divide by their sum along `dim`",
            lambda: torch.exp(scaled),
        ),
        (
            "you normalised over all elements at once: normalise along `dim` only",
            lambda: torch.exp(scaled - scaled.max()) / torch.exp(scaled - scaled.max()).sum(),
        ),
        ("you returned log-softmax: return softmax", lambda: torch.log_softmax(scaled, dim)),
    ]
    return mistakes


def _soft_argmax_case(candidate, scores: torch.Tensor, **kwargs):
    def run():
        expected = ref.soft_argmax(scores, **kwargs)
        got = call_student(
            candidate,
            scores,
            what=f"soft_argmax(scores{_kwargs_text(kwargs)})",
            arg_names=("scores",),
            **kwargs,
        )
        beta = kwargs.get("beta", 1.0)
        dim = kwargs.get("dim", -1)
        expect_close(
            got,
            expected,
            "weights",
            mistakes=_soft_argmax_mistakes(scores, beta, dim),
            hints=[sums_to_one_hint(dim, "`dim`", masked=False)],
        )

    return run


def _soft_argmax_grad(candidate):
    def run():
        scores = randn(3, 5, seed=18)
        mine, theirs = leaf(scores), leaf(scores)
        expected = ref.soft_argmax(theirs, beta=1.5)
        got = call_student(candidate, mine, beta=1.5, what="soft_argmax(scores, beta=1.5)")
        expect_close(got, expected, "weights")
        expect_same_grads(got, expected, {"`scores`": (mine, theirs)})

    return run


@checker(
    "soft_argmax",
    # the statement says: with torch.exp and sum, not torch.softmax
    answer_builtins=(
        "torch.softmax",
        "torch.nn.functional.softmax",
        "torch.special.softmax",
        "torch.nn.Softmax",
        "torch.Tensor.softmax",
        # softmax by another road: exp(log_softmax(z)) (the operator match found it already)
        "torch.log_softmax",
        "torch.nn.functional.log_softmax",
        "torch.Tensor.log_softmax",
    ),
)
def check_soft_argmax(candidate) -> list[Case]:
    """Check ``soft_argmax(scores, beta=1.0, dim=-1) -> softmax(beta * scores)``."""
    return [
        Case("1-D scores", _soft_argmax_case(candidate, randn(5, seed=1)), weight=TRIVIAL),
        Case("2-D scores, rows sum to 1", _soft_argmax_case(candidate, randn(3, 5, seed=2))),
        Case(
            "beta=2.5",
            _soft_argmax_case(candidate, randn(4, 6, seed=3), beta=2.5),
            covers=frozenset({"beta"}),
        ),
        Case(
            "beta=0.1, 3-D scores",
            _soft_argmax_case(candidate, randn(2, 3, 4, seed=4), beta=0.1),
            covers=frozenset({"beta"}),
        ),
        Case(
            "dim=0",
            _soft_argmax_case(candidate, randn(4, 6, seed=5), dim=0),
            covers=frozenset({"dim"}),
        ),
        Case(
            "dim=1 of a 3-D tensor, beta=3",
            _soft_argmax_case(candidate, randn(2, 4, 3, seed=6), beta=3.0, dim=1),
            covers=frozenset({"beta", "dim"}),
        ),
        Case(
            "very large scores (~1e4) give no NaN",
            _soft_argmax_case(candidate, 1e4 * randn(3, 5, seed=7)),
        ),
        Case(
            "very negative scores (~-1e4) give no NaN",
            _soft_argmax_case(candidate, -1e4 + randn(2, 5, seed=8)),
        ),
        Case(
            "float32 scores give float32 weights",
            _soft_argmax_case(candidate, randn(3, 4, seed=9, dtype=torch.float32)),
        ),
        Case(
            "gradient flows to the scores",
            _soft_argmax_grad(candidate),
            covers=frozenset({"grad", "beta"}),
        ),
    ]


# ---------------------------------------------------------------- set_attention


def _set_attention_variants(X: torch.Tensor, beta: float, hard: bool) -> dict[str, tuple]:
    """(H, A) of the mistakes a student is likely to make in set attention."""
    scores = X @ X.transpose(-2, -1)  # (..., T, n) @ (..., n, T) -> (..., T, T)

    def weights(s, dim=-1):
        return ref.hard_argmax(beta * s, dim=dim) if hard else torch.softmax(beta * s, dim=dim)

    variants = {}
    A = weights(scores, dim=-2)
    variants[
        "your softmax runs over the first T axis (dim=-2): each row of A (one query) must sum to 1"
    ] = (A @ X, A)
    A = weights(scores)
    variants["you multiplied A^T @ X: the output is H = A @ X"] = (A.transpose(-2, -1) @ X, A)
    if beta != 1.0:
        A = ref.hard_argmax(scores) if hard else torch.softmax(scores, dim=-1)
        variants["`beta` is ignored: the weights are soft_argmax(beta * X X^T)"] = (A @ X, A)
    if hard:
        A = torch.softmax(beta * scores, dim=-1)
        variants["`hard=True` is ignored: use hard_argmax instead of soft_argmax"] = (A @ X, A)
    else:
        A = torch.softmax(beta * scores / math.sqrt(X.shape[-1]), dim=-1)
        variants["you scaled the scores by 1/sqrt(n): set attention uses X X^T unscaled"] = (
            A @ X,
            A,
        )
    return variants


def _set_attention_case(candidate, X: torch.Tensor, **kwargs):
    def run():
        expected_H, expected_A = ref.set_attention(X, **kwargs)
        got = call_student(
            candidate, X, what=f"set_attention(X{_kwargs_text(kwargs)})", arg_names=("X",), **kwargs
        )
        got = expect_tuple(got, 2, "set_attention", ("H", "A"))
        _check_pair_order(got, expected_H, expected_A, ("H", "A"))
        variants = _set_attention_variants(X, kwargs.get("beta", 1.0), kwargs.get("hard", False))
        expect_weights_then_output(
            got, (expected_H, expected_A), variants, ("H", "A (the weights)"), masked=False
        )

    return run


def _check_pair_order(got, first: torch.Tensor, second: torch.Tensor, names) -> None:
    """Catch ``return second, first`` when the two shapes differ."""
    a, b = got
    if (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and first.shape != second.shape
        and a.shape == second.shape
        and b.shape == first.shape
    ):
        raise CaseFailed(
            f"the results come back in the wrong order: got shapes {fmt_shape(a.shape)} and "
            f"{fmt_shape(b.shape)}; return ({names[0]} {fmt_shape(first.shape)}, "
            f"{names[1]} {fmt_shape(second.shape)})"
        )


def _set_attention_grad(candidate):
    def run():
        X = randn(2, 4, 3, seed=27)
        mine, theirs = leaf(X), leaf(X)
        expected_H, _ = ref.set_attention(theirs, beta=0.5)
        got = call_student(candidate, mine, beta=0.5, what="set_attention(X, beta=0.5)")
        got_H = expect_tuple(got, 2, "set_attention", ("H", "A"))[0]
        expect_close(got_H, expected_H, "H")
        expect_same_grads(got_H, expected_H, {"`X`": (mine, theirs)})

    return run


def _set_attention_input(*shape: int, seed: int, scale: float = 1.0, **kwargs) -> torch.Tensor:
    """``scale * randn(*shape)``, redrawn (`draw_until`) until the softmax over the wrong
    axis and ``A^T @ X`` (:func:`_set_attention_variants`) give H or A at least 0.01 away
    from the reference's, and, for hard attention, every row's best score leads the next
    by 1e-6 (for large inputs, by 40 even when scaled by 1/sqrt(n): every row saturated).
    With a symmetric hard A (each token its own best match) ``A^T @ X`` is ``A @ X``, and
    a run seed that drew one would let that mistake pass the case."""
    beta, hard = kwargs.get("beta", 1.0), kwargs.get("hard", False)

    def keep(X: torch.Tensor) -> bool:
        H, A = ref.set_attention(X, **kwargs)
        for mistake, (H_wrong, A_wrong) in _set_attention_variants(X, beta, hard).items():
            if "dim=-2" not in mistake and "A^T" not in mistake:
                continue  # the other mistakes show on any input, or never (beta when hard)
            apart = max((H_wrong - H).abs().max().item(), (A_wrong - A).abs().max().item())
            if apart < 0.01:
                return False
        top2 = (beta * X @ X.transpose(-2, -1)).topk(2, dim=-1).values
        gap = top2[..., 0] - top2[..., 1]
        if hard and bool((gap < 1e-6).any()):
            return False
        # large inputs: every row saturated, even with the scores scaled by 1/sqrt(n)
        return scale <= 10 or bool((gap / math.sqrt(X.shape[-1]) > 40).all())

    return draw_until(lambda name: scale * randn(*shape, seed=name), keep, seed)


@checker("set_attention")
def check_set_attention(candidate) -> list[Case]:
    """Check ``set_attention(X, beta=1.0, hard=False) -> (H, A)``."""
    return [
        Case(
            "X (T, n) with T != n",
            _set_attention_case(candidate, _set_attention_input(5, 3, seed=21)),
        ),
        Case(
            "batched X (B, T, n)",
            _set_attention_case(candidate, _set_attention_input(2, 4, 6, seed=22)),
        ),
        Case(
            "beta=0.3",
            _set_attention_case(candidate, _set_attention_input(4, 3, seed=23, beta=0.3), beta=0.3),
            covers=frozenset({"beta"}),
        ),
        Case(
            "hard=True (one-hot rows)",
            _set_attention_case(
                candidate, _set_attention_input(5, 4, seed=24, hard=True), hard=True
            ),
            covers=frozenset({"hard"}),
        ),
        Case(
            "hard=True, batched, beta=2",
            _set_attention_case(
                candidate,
                _set_attention_input(2, 3, 5, seed=25, beta=2.0, hard=True),
                beta=2.0,
                hard=True,
            ),
            covers=frozenset({"hard", "beta"}),
        ),
        Case(
            "T = 1",
            _set_attention_case(candidate, randn(1, 4, seed=26)),
            weight=TRIVIAL,
            support=True,
        ),
        Case(
            "large inputs (scores ~1e4) give no NaN",
            _set_attention_case(candidate, _set_attention_input(4, 3, seed=28, scale=60.0)),
            support=True,  # the weights saturate to the identity: so does a degenerate answer
        ),
        Case("gradient flows to X", _set_attention_grad(candidate), covers=frozenset({"grad"})),
    ]


# ---------------------------------------------------------------- scaled dot-product


def _sdpa_variants(q, k, v, mask=None, scale=None) -> dict[str, tuple]:
    d_k, d_v = q.shape[-1], v.shape[-1]
    raw = q @ k.transpose(-2, -1)  # (..., T, Dk) @ (..., Dk, S) -> (..., T, S)
    s = 1.0 / math.sqrt(d_k) if scale is None else scale
    variants = {}
    if scale is not None:
        ignored = "scale-zero-ignored" if scale == 0 else "scale-argument-ignored"
        variants[says(ignored)] = attend(raw / math.sqrt(d_k), v, mask)
    else:
        variants[says("scale-missing")] = attend(raw, v, mask)
        variants[says("scale-by-d-k")] = attend(raw / d_k, v, mask)
        variants[says("scale-multiplied")] = attend(raw * math.sqrt(d_k), v, mask)
        if d_v != d_k:
            variants[says("scale-by-d-v")] = attend(raw / math.sqrt(d_v), v, mask)
        if q.dim() == 4 and q.shape[-3] > 1:  # (B, H, T, d_k): the model width H * d_k
            width = q.shape[-3] * d_k
            variants[says("scale-by-model-width")] = attend(raw / math.sqrt(width), v, mask)
        for length in dict.fromkeys((q.shape[-2], k.shape[-2])):
            if length not in (d_k, 1):
                variants[says("scale-by-length")] = attend(raw / math.sqrt(length), v, mask)
                break
    variants[says("softmax-over-queries")] = attend(raw * s, v, mask, dim=-2)
    variants[says("keys-averaged")] = attend(raw * s, k, mask)
    if mask is not None and mask.dtype == torch.bool:
        variants[says("mask-inverted")] = attend(raw * s, v, mask, invert=True)
        variants[says("mask-after-softmax")] = attend(raw * s, v, mask, after=True)
        variants[says("mask-ignored")] = attend(raw * s, v)
        variants[says("fully-masked-row-nan")] = attend(raw * s, v, mask, fill="nan")
        variants[says("fully-masked-row-uniform")] = attend(raw * s, v, mask, fill="large-negative")
        variants[says("bool-mask-multiplies")] = attend(raw * s * mask, v)
    elif mask is not None:
        variants[says("float-mask-ignored")] = attend(raw * s, v)
        variants[says("float-mask-multiplies")] = attend(raw * s * mask, v)
        variants[says("float-mask-as-bool")] = attend(raw * s, v, mask == 0)
        variants[says("float-mask-nonzero-as-bool")] = attend(raw * s, v, mask != 0)
    return variants


def _saturated(q: torch.Tensor, k: torch.Tensor, scale: float, margin: float = 40.0) -> bool:
    """Whether every row of ``scale * q k^T`` has its best score ``margin`` ahead of the
    next (a softmax of it is one-hot to float64's precision)."""
    top2 = (q @ k.transpose(-2, -1)).topk(2, dim=-1).values
    return bool(((top2[..., 0] - top2[..., 1]) * scale > margin).all())


def _sdpa_case(candidate, q, k, v, **kwargs):
    def run():
        expected_out, expected_w = ref.scaled_dot_product_attention(q, k, v, **kwargs)
        got = call_student(
            candidate,
            q,
            k,
            v,
            what=f"scaled_dot_product_attention(query, key, value{_kwargs_text(_short(kwargs))})",
            arg_names=("query", "key", "value"),
            **kwargs,
        )
        got = expect_tuple(got, 2, "scaled_dot_product_attention", ("output", "weights"))
        _check_pair_order(got, expected_out, expected_w, ("output", "weights"))
        variants = _sdpa_variants(q, k, v, kwargs.get("mask"), kwargs.get("scale"))
        expect_weights_then_output(got, (expected_out, expected_w), variants)

    return run


def _short(kwargs: dict) -> dict:
    """Keyword arguments for a message: tensors shown by their shape."""
    out = {}
    for key, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            out[key] = _ShapeRepr(value)
        else:
            out[key] = value
    return out


class _ShapeRepr:
    def __init__(self, t: torch.Tensor):
        kind = "bool" if t.dtype == torch.bool else "float"
        self.text = f"<{kind} {fmt_shape(t.shape)}>"

    def __repr__(self) -> str:
        return self.text


def _sdpa_grad(candidate):
    def run():
        q, k, v = randn(2, 3, 4, seed=41), randn(2, 5, 4, seed=42), randn(2, 5, 6, seed=43)
        mask = random_bool(3, 5, seed=44)
        mine, theirs = leaves(q, k, v)
        expected, _ = ref.scaled_dot_product_attention(*theirs, mask=mask)
        got = call_student(
            candidate,
            *mine,
            mask=mask,
            what="scaled_dot_product_attention(query, key, value, mask)",
        )
        got_out = expect_tuple(got, 2, "scaled_dot_product_attention", ("output", "weights"))[0]
        expect_close(got_out, expected, "output")
        names = ("`query`", "`key`", "`value`")
        expect_same_grads(got_out, expected, dict(zip(names, zip(mine, theirs))))

    return run


_SDPA_DROPOUT_WHERE = (
    "on the weights, after the softmax: weights = F.dropout(weights, p=dropout_p, "
    "training=True); output = weights @ value"
)


def _sdpa_no_dropout(candidate, q, k, v):
    def run():
        expected_out, expected_w = ref.scaled_dot_product_attention(q, k, v)
        for attempt in ("first", "second"):
            got = call_student(
                candidate,
                q,
                k,
                v,
                dropout_p=0.0,
                what="scaled_dot_product_attention(query, key, value, dropout_p=0.0)",
                arg_names=("query", "key", "value"),
            )
            got = expect_tuple(got, 2, "scaled_dot_product_attention", ("output", "weights"))
            expect_close(got[1], expected_w, f"weights ({attempt} call)")
            expect_close(got[0], expected_out, f"output ({attempt} call)")

    return run


def _expect_right_without_dropout(candidate, q, k, v, mask, clean_out, clean_w) -> None:
    """Before judging where dropout goes, the same call with ``dropout_p=0.0`` must be right,
    so that a wrong scale or mask is not reported as a dropout mistake."""
    kwargs = {"dropout_p": 0.0} if mask is None else {"mask": mask, "dropout_p": 0.0}
    got = call_student(candidate, q, k, v, what="the same call with dropout_p=0.0", **kwargs)
    if not (isinstance(got, tuple) and len(got) == 2):
        return  # the cases without dropout report the type
    for value, expected in zip(got, (clean_out, clean_w), strict=True):
        if not isinstance(value, torch.Tensor) or value.shape != expected.shape:
            return
        atol, rtol = tolerances(expected.dtype)
        if not torch.allclose(value.detach().to(expected.dtype), expected, atol=atol, rtol=rtol):
            raise CaseFailed(
                "the result is already wrong with dropout_p=0.0 on these inputs: fix the "
                "cases without dropout above first; this case checks only where dropout goes"
            )


def _sdpa_dropout_case(candidate, q, k, v, p: float, mask=None):
    """Dropout by its properties: the weights are the clean ones, dropped and rescaled."""

    def run():
        clean_out, clean_w = ref.scaled_dot_product_attention(q, k, v, mask=mask)
        _expect_right_without_dropout(candidate, q, k, v, mask, clean_out, clean_w)
        kwargs = {"dropout_p": p} if mask is None else {"mask": mask, "dropout_p": p}
        got = call_student(
            candidate,
            q,
            k,
            v,
            what=f"scaled_dot_product_attention(query, key, value{_kwargs_text(_short(kwargs))})",
            arg_names=("query", "key", "value"),
            **kwargs,
        )
        got_out, got_w = expect_tuple(got, 2, "scaled_dot_product_attention", ("output", "weights"))
        expect_like(got_w, clean_w, "weights")
        expect_like(got_out, clean_out, "output")
        if is_unchanged(got_w, clean_w):
            if is_unchanged(got_out, clean_out):
                raise CaseFailed(
                    f"`dropout_p` is ignored: with dropout_p={p:g} about {p:.0%} of the weights "
                    "must be set to 0 and the rest scaled by 1 / (1 - dropout_p); dropout goes "
                    + _SDPA_DROPOUT_WHERE
                )
            if looks_dropped_out(got_out, clean_out, p):
                raise CaseFailed(
                    "dropout is applied to the output (weights @ value): its entries are "
                    "zeroed or scaled by 1 / (1 - dropout_p) while the weights are untouched; "
                    "dropout belongs " + _SDPA_DROPOUT_WHERE
                )
            raise CaseFailed(
                "you returned the weights from before dropout: the output was computed with "
                "other weights, but the task asks for the weights actually used, so that "
                "output == weights @ value; return the weights after dropout"
            )
        expect_dropout_of(
            got_w,
            clean_w,
            p,
            "weights",
            ignored="`dropout_p` is ignored",
            where=_SDPA_DROPOUT_WHERE,
        )
        expect_close(
            got_out,
            got_w.detach().to(v.dtype) @ v,
            "output (it must equal your weights @ value)",
            mistakes=[
                (
                    "the output uses the weights before dropout: compute the output from the "
                    "dropped-out weights, output = weights @ value",
                    lambda: clean_out,
                )
            ],
        )

    return run


@checker(
    "scaled_dot_product_attention",
    answer_builtins=("torch.nn.functional.scaled_dot_product_attention",),
)
def check_scaled_dot_product_attention(candidate) -> list[Case]:
    """Check ``scaled_dot_product_attention(query, key, value, mask=None, dropout_p=0.0,
    scale=None) -> (output, weights)``."""
    B, T, S, Dk, Dv, H = 2, 3, 5, 4, 6, 3
    q3, k3, v3 = randn(B, T, Dk, seed=31), randn(B, S, Dk, seed=32), randn(B, S, Dv, seed=33)
    q4, k4, v4 = (
        randn(B, H, T, Dk, seed=34),
        randn(B, H, S, Dk, seed=35),
        randn(B, H, S, Dv, seed=36),
    )
    causal_like = random_bool(T, S, seed=37)
    lengths = torch.tensor([3, 5])
    padding = (torch.arange(S) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)
    fully_masked = random_bool(B, T, S, seed=38)
    fully_masked[0, 1] = False
    float_mask = torch.zeros(T, S, dtype=torch.float64).masked_fill(~causal_like, float("-inf"))
    # A finite bias with zeros, negatives and positives, like ALiBi's or a relative-position
    # bias: adding it and converting it to a bool mask give different weights.
    float_bias = randn(T, S, seed=30).masked_fill(random_bool(T, S, seed=29, p=0.3), 0.0)
    big_q, big_k, big_v = (
        randn(4, 16, 8, seed=46),
        randn(4, 16, 8, seed=47),
        randn(4, 16, 5, seed=48),
    )
    big_mask = random_bool(4, 16, 16, seed=49)
    # ~1e4 scores: every row saturated (best score ahead of the next by 40 or more) under
    # the right scale and every wrong one (none, 1/d_k, 1/sqrt(d_v)), so the case tests the
    # absence of NaN and a scaling mistake passes it under every seed (none is hidden there:
    # the cases above catch them)
    huge_q, huge_k = draw_until(
        lambda name: (60.0 * randn(B, T, Dk, seed=name), 60.0 * randn(B, S, Dk, seed=name + 1)),
        lambda qk: _saturated(*qk, min(1.0, 1.0 / Dk, 1.0 / math.sqrt(Dv))),
        31,
    )
    return [
        Case("3-D inputs, T != S, d_k != d_v", _sdpa_case(candidate, q3, k3, v3)),
        Case("4-D inputs with heads (B, H, T, d_k)", _sdpa_case(candidate, q4, k4, v4)),
        Case(
            "2-D inputs (no batch axis)",
            _sdpa_case(candidate, randn(4, 3, seed=39), randn(6, 3, seed=40), randn(6, 2, seed=45)),
        ),
        Case("T = 1", _sdpa_case(candidate, q3[:, :1], k3, v3), weight=TRIVIAL),
        # a batch of one keeps its batch axis (a `.squeeze()` would drop it)
        Case("batch size B = 1", _sdpa_case(candidate, q3[:1], k3[:1], v3[:1])),
        Case(
            "explicit scale=0.3",
            _sdpa_case(candidate, q3, k3, v3, scale=0.3),
            covers=frozenset({"scale"}),
        ),
        Case(
            "scale=0.0: uniform weights",
            _sdpa_case(candidate, q3, k3, v3, scale=0.0),
            covers=frozenset({"scale", "scale=0"}),
            support=True,  # a degenerate answer (uniform weights everywhere) passes it too
        ),
        Case(
            "bool mask (T, S) broadcast over the batch",
            _sdpa_case(candidate, q3, k3, v3, mask=causal_like),
            covers=frozenset({"mask", "mask=bool"}),
        ),
        Case(
            "padding mask (B, 1, 1, S) on 4-D inputs",
            _sdpa_case(candidate, q4, k4, v4, mask=padding),
            covers=frozenset({"mask", "mask=bool"}),
        ),
        Case(
            "fully masked query row: zero weights and zero output",
            _sdpa_case(candidate, q3, k3, v3, mask=fully_masked),
            covers=frozenset({"mask", "mask=fully-masked-row"}),
        ),
        Case(
            "float additive mask (0 / -inf)",
            _sdpa_case(candidate, q3, k3, v3, mask=float_mask),
            covers=frozenset({"mask", "mask=float"}),
        ),
        Case(
            "float mask holding a general bias (added to the scores)",
            _sdpa_case(candidate, q3, k3, v3, mask=float_bias),
            covers=frozenset({"mask", "mask=float", "mask=float-bias"}),
        ),
        Case(
            "very large scores (~1e4) give no NaN",
            _sdpa_case(candidate, huge_q, huge_k, v3),
        ),
        Case(
            "dropout_p=0.0 given explicitly: no randomness",
            _sdpa_no_dropout(candidate, q3, k3, v3),
            weight=TRIVIAL,
        ),
        Case(
            "dropout_p=0.3: weights dropped out, output == weights @ value",
            _sdpa_dropout_case(candidate, big_q, big_k, big_v, 0.3),
            covers=frozenset({"dropout_p"}),
        ),
        Case(
            "dropout_p=0.5 with a bool mask",
            _sdpa_dropout_case(candidate, big_q, big_k, big_v, 0.5, mask=big_mask),
            covers=frozenset({"dropout_p", "mask", "mask=bool"}),
        ),
        Case(
            "gradients flow to query, key and value",
            _sdpa_grad(candidate),
            covers=frozenset({"grad", "mask", "mask=bool"}),
        ),
    ]


# ---------------------------------------------------------------- additive attention


def _additive_variants(module, query, keys, values, mask) -> dict[str, tuple]:
    W, U, v = module.W.weight, module.U.weight, module.v.weight
    q = query if query.dim() == 3 else query[:, None, :]  # (B, Dq) -> (B, 1, Dq)
    m = None
    if mask is not None:
        m = mask if query.dim() == 3 else mask[:, None, :]  # (B, S) -> (B, 1, S)
    features = (q @ W.T)[:, :, None, :] + (keys @ U.T)[:, None, :, :]  # (B, T, S, hidden)

    def finish(scores, dim=-1, ignore_mask=False, **kw):
        out, weights = attend(scores, values, None if ignore_mask else m, dim=dim, **kw)
        if query.dim() == 2:
            return out[:, 0], weights[:, 0]
        return out, weights

    good = (torch.tanh(features) @ v.T)[..., 0]  # (B, T, S)
    variants = {
        says("additive-tanh-missing"): finish((features @ v.T)[..., 0]),
        says("additive-relu"): finish((torch.relu(features) @ v.T)[..., 0]),
        says("additive-scaled"): finish(good / math.sqrt(W.shape[0])),
    }
    if query.dim() == 3:
        variants[says("softmax-over-queries")] = finish(good, dim=-2)
    else:
        out, weights = finish(good)
        variants[says("single-query-axis-kept")] = (out[:, None], weights[:, None])
    if query.dim() == 2 and query.shape[0] > 1:
        batch_weights = _masked_softmax(good, m, dim=0)  # (B, 1, S), sums to 1 over B
        variants[says("softmax-over-batch")] = (
            (batch_weights @ values)[:, 0],
            batch_weights[:, 0],
        )
    if mask is not None and query.dim() == 2 and mask.dim() == 2:
        out, weights = attend(good, values, mask)  # (B, 1, S) with (B, S) -> (B, B, S)
        variants[says("single-query-mask-broadcast")] = (out[:, 0], weights[:, 0])
    if mask is not None:
        variants[says("mask-inverted")] = finish(good, invert=True)
        variants[says("mask-after-softmax")] = finish(good, after=True)
        variants[says("mask-ignored")] = finish(good, ignore_mask=True)
        variants[says("fully-masked-row-nan")] = finish(good, fill="nan")
    return variants


def _masked_softmax(scores, mask, dim):
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.nan_to_num(torch.softmax(scores, dim=dim), nan=0.0)


def _additive_case(candidate, query, keys, values, mask=None, dims=(3, 5, 4)):
    def run():
        pair = ModulePair(candidate, ref.AdditiveAttention, dims, train=False)
        got, (expected_ctx, expected_w) = pair.call(
            query,
            keys,
            values,
            mask=mask,
            what="attention(query, keys, values" + (", mask)" if mask is not None else ")"),
            arg_names=("query", "keys", "values"),
        )
        got = expect_tuple(got, 2, "AdditiveAttention.forward", ("context", "weights"))
        _check_pair_order(got, expected_ctx, expected_w, ("context", "weights"))
        with torch.no_grad():
            variants = _additive_variants(pair.reference, query, keys, values, mask)
        try:
            expect_weights_then_output(
                got, (expected_ctx, expected_w), variants, ("context", "weights")
            )
        except CaseFailed as failure:
            text = str(failure)
            if "expected shape" in text and "\n" not in text:
                text += (
                    "\nHint: `.squeeze()` with no dim drops every size-1 axis, also the query "
                    "axis of a single query (T = 1), S = 1 or B = 1: squeeze only the axis you "
                    "mean, e.g. `.squeeze(-1)` after `v`, and `[:, 0]` for a single query."
                )
            raise CaseFailed(text) from None

    return run


def _additive_grad(candidate):
    def run():
        pair = ModulePair(candidate, ref.AdditiveAttention, (3, 5, 4))
        query, keys, values = (
            randn(2, 2, 3, seed=61),
            randn(2, 4, 5, seed=62),
            randn(2, 4, 6, seed=63),
        )
        mask = random_bool(2, 1, 4, seed=64)
        got, (expected, _) = pair.call(
            query,
            keys,
            values,
            mask=mask,
            what="attention(query, keys, values, mask)",
            arg_names=(),
            grad=True,
        )
        got_ctx, got_w = expect_tuple(got, 2, "AdditiveAttention.forward", ("context", "weights"))
        expect_close(got_ctx, expected, "context")
        if isinstance(got_w, torch.Tensor) and not got_w.requires_grad:
            raise CaseFailed(
                "the returned weights do not require grad: they are detached from the graph "
                "(`.detach()`, `.data` or `torch.no_grad()`), so a loss on the weights (e.g. an "
                "attention-supervision loss) cannot train W, U and v; return them as computed"
            )
        pair.expect_grads(got_ctx, expected, ("`query`", "`keys`", "`values`"))

    return run


@checker("additive_attention", "AdditiveAttention")
def check_additive_attention(candidate) -> list[Case]:
    """Check the class ``AdditiveAttention(query_dim, key_dim, hidden_dim)``."""
    B, T, S, Dq, Dk, Dv = 2, 3, 5, 3, 5, 6
    q2, q3 = randn(B, Dq, seed=51), randn(B, T, Dq, seed=52)
    keys, values = randn(B, S, Dk, seed=53), randn(B, S, Dv, seed=54)
    mask2 = torch.arange(S) < torch.tensor([3, 5])[:, None]  # (B, S)
    mask3 = random_bool(B, 1, S, seed=55)  # (B, 1, S)
    fully = random_bool(B, T, S, seed=56)
    fully[1, 0] = False
    return [
        Case(
            "query (B, Dq): context (B, Dv), weights (B, S)",
            _additive_case(candidate, q2, keys, values),
        ),
        Case(
            "query (B, T, Dq): context (B, T, Dv), weights (B, T, S)",
            _additive_case(candidate, q3, keys, values),
        ),
        Case("S = 1", _additive_case(candidate, q3, keys[:, :1], values[:, :1]), weight=TRIVIAL),
        Case(
            "padding mask (B, S) with query (B, Dq)",
            _additive_case(candidate, q2, keys, values, mask2),
            covers=frozenset({"mask", "mask=(B, S)"}),
        ),
        Case(
            "mask (B, 1, S) broadcast over T queries",
            _additive_case(candidate, q3, keys, values, mask3),
            covers=frozenset({"mask", "mask=(B, 1, S)"}),
        ),
        Case(
            "fully masked query row: zero weights and zero context",
            _additive_case(candidate, q3, keys, values, fully),
            covers=frozenset({"mask", "mask=(B, T, S)", "mask=fully-masked-row"}),
        ),
        Case(
            "gradients reach W, U, v and the inputs",
            _additive_grad(candidate),
            covers=frozenset({"grad", "mask", "mask=(B, 1, S)"}),
        ),
    ]
