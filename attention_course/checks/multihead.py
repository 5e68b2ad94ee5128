"""Checkers for multi-head attention: ``split_heads``, ``merge_heads`` and
``MultiHeadAttention``."""

from __future__ import annotations

import torch

from attention_course import multihead as ref

from ._compare import expect_close, expect_like, expect_tuple, fmt_shape
from ._data import randn, random_bool
from ._dropout import expect_dropout_of, is_unchanged, looks_dropped_out
from ._mistakes import says
from ._modules import ModulePair, build_pair, expect_same_grads, leaves
from ._runner import TRIVIAL, Case, CaseFailed, call_student, checker
from ._weights import attention_variant, expect_weights_then_output

# ---------------------------------------------------------------- split / merge


def _split_mistakes(x: torch.Tensor, H: int):
    B, T, D = x.shape
    Dh = D // H
    return [
        (says("heads-split-without-transpose"), lambda: x.reshape(B, H, T, Dh)),
        (
            says("heads-split-interleaved"),
            lambda: x.reshape(B, T, Dh, H).permute(0, 3, 1, 2),
        ),
        (says("heads-split-transpose-missing"), lambda: x.reshape(B, T, H, Dh)),
    ]


def _merge_mistakes(x: torch.Tensor):
    B, H, T, Dh = x.shape
    return [
        (says("heads-merged-without-transpose"), lambda: x.reshape(B, T, H * Dh)),
        (
            says("heads-merged-interleaved"),
            lambda: x.permute(0, 2, 3, 1).reshape(B, T, H * Dh),
        ),
        (says("heads-merge-reshape-missing"), lambda: x.transpose(1, 2)),
    ]


def _split_case(candidate, shape: tuple[int, int, int], H: int, seed: int, grad: bool = False):
    def run():
        x = randn(*shape, seed=seed)
        (mine,), (theirs,) = leaves(x, grad=grad)
        expected = ref.split_heads(theirs, H)
        got = call_student(
            candidate, mine, H, what=f"split_heads(x {fmt_shape(shape)}, {H})", arg_names=("x",)
        )
        expect_close(got, expected, "the result", mistakes=_split_mistakes(x, H))
        if grad:
            expect_same_grads(got, expected, {"`x`": (mine, theirs)})

    return run


@checker("split_heads")
def check_split_heads(candidate) -> list[Case]:
    """Check ``split_heads(x (B, T, D), num_heads) -> (B, H, T, Dh)``."""
    return [
        Case("(B, T, D) = (2, 3, 8), H = 2", _split_case(candidate, (2, 3, 8), 2, seed=71)),
        Case("H = 1", _split_case(candidate, (2, 3, 6), 1, seed=72), weight=TRIVIAL),
        Case("H = 4", _split_case(candidate, (2, 5, 8), 4, seed=73)),
        Case("B = 1, T = 5, D = 6, H = 3", _split_case(candidate, (1, 5, 6), 3, seed=74)),
        Case("T = 1", _split_case(candidate, (3, 1, 8), 2, seed=75), weight=TRIVIAL),
        Case(
            "gradient flows to x",
            _split_case(candidate, (2, 3, 8), 2, seed=76, grad=True),
            covers=frozenset({"grad"}),
        ),
    ]


def _merge_case(candidate, shape: tuple[int, int, int, int], seed: int, grad: bool = False):
    def run():
        x = randn(*shape, seed=seed)
        (mine,), (theirs,) = leaves(x, grad=grad)
        expected = ref.merge_heads(theirs)
        got = call_student(
            candidate, mine, what=f"merge_heads(x {fmt_shape(shape)})", arg_names=("x",)
        )
        expect_close(got, expected, "the result", mistakes=_merge_mistakes(x))
        if grad:
            expect_same_grads(got, expected, {"`x`": (mine, theirs)})

    return run


def _merge_roundtrip(candidate):
    def run():
        x = randn(2, 5, 6, seed=86)
        got = call_student(candidate, ref.split_heads(x, 3), what="merge_heads(split_heads(x, 3))")
        expect_close(
            got,
            x,
            "merge_heads(split_heads(x, 3))",
            mistakes=_merge_mistakes(ref.split_heads(x, 3)),
        )

    return run


@checker("merge_heads")
def check_merge_heads(candidate) -> list[Case]:
    """Check ``merge_heads(x (B, H, T, Dh)) -> (B, T, H * Dh)``."""
    return [
        Case("(B, H, T, Dh) = (2, 2, 3, 4)", _merge_case(candidate, (2, 2, 3, 4), seed=81)),
        Case("H = 1", _merge_case(candidate, (2, 1, 3, 5), seed=82), weight=TRIVIAL),
        Case("H = 4, T = 5", _merge_case(candidate, (2, 4, 5, 2), seed=83)),
        Case("B = 1, T = 1", _merge_case(candidate, (1, 3, 1, 4), seed=84), weight=TRIVIAL),
        Case("undoes split_heads", _merge_roundtrip(candidate), weight=TRIVIAL),
        Case(
            "gradient flows to x",
            _merge_case(candidate, (2, 3, 4, 2), seed=85, grad=True),
            covers=frozenset({"grad"}),
        ),
    ]


# ---------------------------------------------------------------- MultiHeadAttention


def _mha_variants(module, query, key, value, mask) -> dict[str, tuple]:
    """The known mistakes of a ``MultiHeadAttention``: message -> (output, weights)."""

    def v(query=query, key=key, value=value, mask=mask, **kwargs):
        return attention_variant(module, query, key, value, mask, **kwargs)

    variants = {}
    if module.num_heads > 1:
        variants[says("heads-split-without-transpose")] = v(split="no-transpose")
        variants[says("heads-merged-without-transpose")] = v(merge="no-transpose")
        variants[says("heads-split-and-merged-without-transpose")] = v(
            split="no-transpose", merge="no-transpose"
        )
        variants[says("scale-by-d-model")] = v(scale="d_model")
    variants[says("head-scale-missing")] = v(scale="none")
    variants[says("no-output-projection")] = v(out_proj=False)
    variants[says("softmax-over-queries")] = v(dim=-2)
    if mask is not None and mask.dtype == torch.bool:
        variants[says("mask-inverted")] = v(invert=True)
        variants[says("mask-not-passed-on")] = v(mask=None)
        variants[says("fully-masked-row-nan")] = v(fill="nan")
    if mask is not None and mask.dtype != torch.bool:
        variants[says("float-mask-as-bool")] = v(mask=mask == 0)
        variants[says("mask-not-passed-on")] = v(mask=None)
    wrong_inputs = {
        "kv-from-query": (query, query),
        "values-from-key": (key, key),
        "keys-from-value": (value, value),
    }
    for mistake, (k_in, v_in) in wrong_inputs.items():
        try:  # only where the shapes allow the mistake
            variants[says(mistake)] = v(key=k_in, value=v_in)
        except RuntimeError:
            pass
    good = v()
    variants[says("weights-averaged-over-heads")] = (good[0], good[1].mean(dim=1))
    return variants


def _mha_case(candidate, init: dict, shapes, mask=None, need_weights=True, train=False):
    """Compare outputs (and weights) of the student's and the reference's module."""
    (B, T, S), kdim, vdim = shapes

    def run():
        student, reference = build_pair(candidate, ref.MultiHeadAttention, kwargs=init)
        student.train(train)
        reference.train(train)
        D = init["d_model"]
        query = randn(B, T, D, seed=91)
        key = randn(B, S, kdim, seed=92)
        value = randn(B, S, vdim, seed=93)
        expected_out, expected_w = reference(
            query, key, value, mask=mask, need_weights=need_weights
        )
        kwargs = {}
        if mask is not None:
            kwargs["mask"] = mask
        if not need_weights:
            kwargs["need_weights"] = False
        what = "mha(query, key, value" + "".join(f", {k}=..." for k in kwargs) + ")"
        got = call_student(
            student, query, key, value, what=what, arg_names=("query", "key", "value"), **kwargs
        )
        got = expect_tuple(got, 2, "MultiHeadAttention.forward", ("output", "weights"))
        p = init.get("dropout", 0.0)
        if (
            not train
            and p > 0
            and need_weights
            and isinstance(got[1], torch.Tensor)
            and looks_dropped_out(got[1], expected_w, p)
        ):
            raise CaseFailed(
                says(
                    "dropout-in-eval",
                    detail=f"but your weights look dropped out (entries set to 0, the rest "
                    f"scaled by 1 / (1 - {p:g})): pass `dropout_p=self.dropout if "
                    "self.training else 0.0`",
                ),
                mistake="dropout-in-eval",
            )
        with torch.no_grad():
            variants = _mha_variants(reference, query, key, value, mask)
        if need_weights:
            expect_weights_then_output(got, (expected_out, expected_w), variants)
        else:
            expect_close(
                got[0],
                expected_out,
                "output",
                mistakes=[(d, lambda v=v: v[0]) for d, v in variants.items()],
            )
            if got[1] is not None:
                raise CaseFailed(
                    "with need_weights=False the weights must be None, got "
                    + (
                        fmt_shape(got[1].shape)
                        if isinstance(got[1], torch.Tensor)
                        else type(got[1]).__name__
                    )
                )

    return run


def _mha_grad(candidate):
    def run():
        init = {"d_model": 8, "num_heads": 2, "kdim": 5, "vdim": 7}
        pair = ModulePair(candidate, ref.MultiHeadAttention, init=init)
        inputs = (randn(2, 3, 8, seed=94), randn(2, 4, 5, seed=95), randn(2, 4, 7, seed=96))
        mask = random_bool(2, 1, 3, 4, seed=97)
        got, (expected, _) = pair.call(
            *inputs, mask=mask, what="mha(query, key, value, mask)", arg_names=(), grad=True
        )
        got_out = expect_tuple(got, 2, "MultiHeadAttention.forward", ("output", "weights"))[0]
        expect_close(got_out, expected, "output")
        pair.expect_grads(got_out, expected, ("`query`", "`key`", "`value`"))

    return run


_MHA_DROPOUT_WHERE = (
    "on the attention weights, inside the attention: "
    "scaled_dot_product_attention(q, k, v, mask, dropout_p=self.dropout if self.training "
    "else 0.0), as nn.MultiheadAttention does"
)


def _mha_dropout_case(candidate, init: dict):
    """Training mode with dropout: the returned weights are the eval weights, dropped out,
    and the output is computed from exactly those weights."""
    p = init["dropout"]

    def run():
        student, reference = build_pair(candidate, ref.MultiHeadAttention, kwargs=init)
        reference.eval()
        query, key = randn(4, 16, init["d_model"], seed=99), randn(4, 16, init["d_model"], seed=100)
        value = randn(4, 16, init["d_model"], seed=101)
        clean_out, clean_w = reference(query, key, value)
        student.train()
        got = call_student(
            student, query, key, value, what="mha(query, key, value) in training mode"
        )
        got_out, got_w = expect_tuple(got, 2, "MultiHeadAttention.forward", ("output", "weights"))
        expect_like(got_w, clean_w, "weights")
        expect_like(got_out, clean_out, "output")
        if is_unchanged(got_w, clean_w) and is_unchanged(got_out, clean_out):
            raise CaseFailed(
                says(
                    "dropout-never-applied",
                    p=p,
                    what=f"about {p:.0%} of the attention weights must be set to 0; "
                    f"dropout goes {_MHA_DROPOUT_WHERE}",
                ),
                mistake="dropout-never-applied",
            )
        if is_unchanged(got_w, clean_w):
            raise CaseFailed(
                "the returned weights are not dropped out but the output is random: either "
                "dropout is applied somewhere else than on the attention weights (it goes "
                f"{_MHA_DROPOUT_WHERE}), or you return the weights from before dropout "
                "(return the weights the output was computed with)"
            )
        expect_dropout_of(
            got_w,
            clean_w,
            p,
            "weights",
            ignored="dropout is never applied",
            where=_MHA_DROPOUT_WHERE,
        )
        with torch.no_grad():
            v = ref.split_heads(reference.w_v(value), reference.num_heads)  # (B, H, S, Dh)
            heads = got_w.detach().to(v.dtype) @ v  # (B, H, T, S) @ (B, H, S, Dh)
            expected = reference.w_o(ref.merge_heads(heads))  # (B, H, T, Dh) -> (B, T, D)
        expect_close(
            got_out,
            expected,
            "output (computed from your dropped-out weights)",
            mistakes=[(says("dropout-weights-before-dropout"), lambda: clean_out)],
        )

    return run


def _mha_attributes(candidate):
    def run():
        student, _ = build_pair(
            candidate, ref.MultiHeadAttention, kwargs={"d_model": 12, "num_heads": 3}
        )
        for name, value in (("num_heads", 3), ("d_head", 4)):
            got = getattr(student, name, None)
            if got != value:
                raise CaseFailed(f"MultiHeadAttention(12, 3).{name} should be {value}, got {got!r}")

    return run


@checker(
    "multi_head_attention",
    "MultiHeadAttention",
    answer_builtins=(
        "torch.nn.MultiheadAttention",
        "torch.nn.functional.multi_head_attention_forward",
    ),
)
def check_multi_head_attention(candidate) -> list[Case]:
    """Check the class ``MultiHeadAttention(d_model, num_heads, dropout=0.0, bias=True,
    kdim=None, vdim=None)``."""
    B, T, S = 2, 4, 6
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    additive = torch.zeros(T, T, dtype=torch.float64).masked_fill(~causal, float("-inf"))
    padding = (torch.arange(S) < torch.tensor([4, 6])[:, None])[:, None, None, :]  # (B,1,1,S)
    fully = random_bool(B, 1, T, S, seed=98)
    # A finite bias (zeros, negatives, positives), like ALiBi's: added, not a bool mask.
    float_bias = randn(T, S, seed=102).masked_fill(random_bool(T, S, seed=103, p=0.3), 0.0)
    fully[1, 0, 2] = False
    base = {"d_model": 8, "num_heads": 2}
    cross = {"d_model": 8, "num_heads": 2, "kdim": 5, "vdim": 7}
    return [
        Case(
            "attributes num_heads and d_head",
            _mha_attributes(candidate),
            weight=TRIVIAL,
            support=True,
        ),
        Case(
            "self-attention, d_model=8, H=2",
            _mha_case(candidate, base, ((B, T, T), 8, 8)),
        ),
        Case(
            "H = 1",
            _mha_case(candidate, {"d_model": 6, "num_heads": 1}, ((B, T, T), 6, 6)),
            weight=TRIVIAL,
        ),
        Case(
            "H = 4, a single query (T = 1)",
            _mha_case(candidate, {"d_model": 8, "num_heads": 4}, ((B, 1, S), 8, 8)),
            weight=TRIVIAL,
        ),
        Case(
            "cross-attention: T != S, kdim=5, vdim=7",
            _mha_case(candidate, cross, ((B, T, S), 5, 7)),
            covers=frozenset({"kdim", "vdim"}),
        ),
        Case(
            "bias=False",
            _mha_case(candidate, {**base, "bias": False}, ((B, T, S), 8, 8)),
            covers=frozenset({"bias"}),
        ),
        Case(
            "causal mask (T, T)",
            _mha_case(candidate, base, ((B, T, T), 8, 8), mask=causal),
            covers=frozenset({"mask", "mask=bool"}),
        ),
        Case(
            "float additive causal mask (0 / -inf)",
            _mha_case(candidate, base, ((B, T, T), 8, 8), mask=additive),
            covers=frozenset({"mask", "mask=float"}),
        ),
        Case(
            "float mask holding a general bias (added to the scores)",
            _mha_case(candidate, base, ((B, T, S), 8, 8), mask=float_bias),
            covers=frozenset({"mask", "mask=float", "mask=float-bias"}),
        ),
        Case(
            "padding mask (B, 1, 1, S)",
            _mha_case(candidate, cross, ((B, T, S), 5, 7), mask=padding),
            covers=frozenset({"mask", "mask=bool", "kdim", "vdim"}),
        ),
        Case(
            "fully masked query row",
            _mha_case(candidate, base, ((B, T, S), 8, 8), mask=fully),
            covers=frozenset({"mask", "mask=fully-masked-row"}),
        ),
        Case(
            "need_weights=False returns (output, None)",
            _mha_case(candidate, base, ((B, T, S), 8, 8), need_weights=False),
            covers=frozenset({"need_weights"}),
        ),
        Case(
            "dropout=0.3 is off in eval mode",
            _mha_case(candidate, {**base, "dropout": 0.3}, ((B, T, S), 8, 8)),
            covers=frozenset({"dropout", "mode=eval"}),
        ),
        Case(
            "training mode, dropout=0.3: the attention weights are dropped out",
            _mha_dropout_case(candidate, {**base, "dropout": 0.3}),
            covers=frozenset({"dropout", "mode=train", "dropout>0 in training"}),
        ),
        Case(
            "gradients reach every parameter and input",
            _mha_grad(candidate),
            covers=frozenset({"grad", "mode=train", "mask", "mask=bool", "kdim", "vdim"}),
        ),
    ]
