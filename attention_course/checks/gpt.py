"""Checker for ``CausalSelfAttention`` (exercise 13): masked multi-head self-attention
of a decoder-only model, ``forward(x (B, T, D)) -> (B, T, D)``.

Exercise 13 asks for the chapter-13 constructor ``(d_model, num_heads, bias=False,
dropout=0.0)``; the options of chapters 14-15 (``pos``, ``num_kv_heads``, ``window``)
are not checked. The student writes the attention maths from tensor operations:
``F.scaled_dot_product_attention`` and ``nn.MultiheadAttention`` are switched off while
the student's module runs (either would hide the mask, the heads and the scaling).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attention_course import gpt as ref

from . import _data
from ._compare import expect_close, expect_like, fmt_shape, matches, tolerances
from ._data import randn
from ._mistakes import says
from ._modules import build_pair, expect_same_grads, leaves
from ._runner import TRIVIAL, Case, CaseFailed, call_student, checker, forbid_builtins
from ._weights import attention_variant

# ---------------------------------------------------------------- known mistakes

MERGE_MIXES_TOKENS = (
    "or your head merge mixes tokens: reshaping (B, H, T, Dh) to (B, T, D) without "
    "`.transpose(1, 2)` moves later tokens into earlier rows"
)


def _causal_keep(T: int, kind: str) -> torch.Tensor:
    """(T, T) bool, True = may attend: the causal mask, or one of its known mistakes."""
    i = torch.arange(T).reshape(T, 1)
    j = torch.arange(T).reshape(1, T)
    return {
        "causal": j <= i,
        "none": torch.ones(T, T, dtype=torch.bool),
        "no-diagonal": j < i,
        "sees-next": j <= i + 1,
        "inverted": j >= i,
    }[kind]


def _mistakes(module, x):
    """The known mistakes of a ``CausalSelfAttention`` on ``x``: (message, output) pairs,
    simulated by `_weights.attention_variant` as the ``MultiHeadAttention`` ones are."""
    T = x.shape[1]

    def v(mask="causal", **kwargs):
        keep = _causal_keep(T, mask)
        return lambda: attention_variant(module, x, x, x, keep, **kwargs)[0]

    mistakes = [
        (says("no-causal-mask"), v(mask="none")),
        (says("causal-mask-hides-diagonal"), v(mask="no-diagonal")),
        (says("causal-mask-sees-next"), v(mask="sees-next")),
        (says("causal-mask-inverted"), v(mask="inverted")),
        (says("mask-after-softmax"), v(after=True)),
    ]
    if module.num_heads > 1:
        mistakes += [
            (says("scale-by-d-model"), v(scale="d_model")),
            (says("heads-merged-without-transpose"), v(merge="no-transpose")),
            (says("heads-split-without-transpose"), v(split="no-transpose")),
            (
                says("heads-split-and-merged-without-transpose"),
                v(split="no-transpose", merge="no-transpose"),
            ),
            (
                says("heads-split-and-merged-interleaved"),
                v(split="interleaved", merge="interleaved"),
            ),
            (says("heads-split-interleaved"), v(split="interleaved")),
        ]
    mistakes += [
        (says("head-scale-missing"), v(scale="none")),
        (says("no-output-projection"), v(out_proj=False)),
        (says("softmax-over-queries"), v(dim=-2)),
        (says("values-from-w-k"), v(values="w_k")),
    ]
    if module.w_q.bias is not None:
        mistakes.append((says("bias-unused"), v(bias=False)))
    return mistakes


# ---------------------------------------------------------------- running the student

_NO_BUILTIN_ATTENTION = (
    "do not call `F.scaled_dot_product_attention` (with is_causal=True it would do "
    "the task) nor `nn.MultiheadAttention`: write the scores, the causal mask, the "
    "softmax and the weighted sum yourself"
)


def _call(student, x, what: str):
    # nn.MultiheadAttention's forward calls F.multi_head_attention_forward; the package's
    # own modules (the reference, a student's subclass of it) may call both
    targets = [(F, "scaled_dot_product_attention"), (F, "multi_head_attention_forward")]
    with forbid_builtins(targets, _NO_BUILTIN_ATTENTION, package_may=True):
        return call_student(student, x, what=what, arg_names=("x",))


def _what(init: dict, shape) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in init.items())
    return f"CausalSelfAttention({args})(x {fmt_shape(shape)})"


def _init(d_model=8, num_heads=2, **options) -> dict:
    return {"d_model": d_model, "num_heads": num_heads, **options}


def _expect_no_nan(got, name: str) -> None:
    if isinstance(got, torch.Tensor) and got.is_floating_point() and bool(got.isnan().any()):
        first = tuple(int(i) for i in got.isnan().nonzero()[0])
        row = f"position t = {first[1]}" if got.dim() == 3 else f"index {list(first)}"
        message = f"{name} contains NaN (first at {row})."
        if got.dim() == 3 and bool(got[:, 0].isnan().any()):
            message += f"\nLikely mistake: {says('causal-mask-hides-diagonal')}."
        raise CaseFailed(message)


def _build(candidate, init: dict):
    """:func:`build_pair`, naming layers built without the bias that ``bias=True`` asks for."""
    try:
        return build_pair(candidate, ref.CausalSelfAttention, kwargs=init)
    except CaseFailed as error:
        text = str(error)
        if init.get("bias") and "missing:" in text and ".bias" in text:
            raise CaseFailed(f"{text}\nLikely mistake: {says('bias-not-built')}.") from None
        raise


def _single_token_hint(shape):
    """At T = 1 a token attends only to itself, with weight 1: the output is w_o(w_v(x))."""

    def hint(got) -> str | None:
        if shape[1] != 1:
            return None
        return (
            "with T = 1 each token attends only to itself, with weight 1, so the output is "
            "w_o(w_v(x)) whatever the mask and the scaling: check the value projection "
            "(and the output projection)"
        )

    return hint


def _compare_case(candidate, init: dict, shape, *, seed: int, train: bool = False):
    """The student's output equals the reference's on ``x`` of ``shape``."""

    def run():
        student, reference = _build(candidate, init)
        student.train(train)
        reference.train(train)
        x = randn(*shape, seed=seed)
        with torch.no_grad():
            expected, _ = reference(x, need_weights=True)
            mistakes = _mistakes(reference, x)
        what = _what(init, shape)
        got = _call(student, x, what)
        _expect_no_nan(got, "your output")
        if (
            not train
            and init.get("dropout", 0.0) > 0
            and isinstance(got, torch.Tensor)
            and not torch.equal(got, _call(student, x, what))
        ):
            raise CaseFailed(
                says(
                    "dropout-in-eval",
                    detail="but two calls on the same x gave different outputs: use "
                    "`F.dropout(weights, p=self.dropout, training=self.training)` (or an "
                    "nn.Dropout module, which follows module.eval())",
                ),
                mistake="dropout-in-eval",
            )
        _expect_same_in_both_modes(student, x, got, expected, init, train, what)
        expect_close(
            got, expected, "the output", mistakes=mistakes, hints=[_single_token_hint(shape)]
        )

    return run


def _expect_same_in_both_modes(student, x, got, expected, init: dict, train: bool, what: str):
    """With dropout=0 the training and eval outputs are the same: an output that is wrong
    in this mode but right in the other one comes from code that depends on self.training
    (a mask applied in one mode only)."""
    if init.get("dropout", 0.0) != 0 or not isinstance(got, torch.Tensor):
        return
    if got.shape != expected.shape or matches(
        got.detach().cpu(), expected, *tolerances(expected.dtype)
    ):
        return
    student.train(not train)
    try:
        other = _call(student, x, what)
    except CaseFailed:
        return
    finally:
        student.train(train)
    if not isinstance(other, torch.Tensor) or other.shape != expected.shape:
        return
    if matches(other.detach().cpu(), expected, *tolerances(expected.dtype)):
        this, that = ("training", "eval") if train else ("eval", "training")
        raise CaseFailed(
            f"the output is wrong in {this} mode but right in {that} mode (dropout=0, so "
            "both modes must give the same output).\nLikely mistake: "
            f"{says('causal-mask-one-mode', mode=that)}."
        )


def _causality_case(candidate, init: dict):
    """Changing the tokens after position t0 must not change the outputs at 0 .. t0."""

    def run():
        B, T, D = 2, 7, init["d_model"]
        t0 = 3
        student, _ = _build(candidate, init)
        student.eval()
        x = randn(B, T, D, seed=121)
        changed = x.clone()
        changed[:, t0 + 1 :] = randn(B, T - t0 - 1, D, seed=122)
        what = _what(init, x.shape)
        got = _call(student, x, what)
        _expect_no_nan(got, "your output")
        got_changed = _call(student, changed, what)
        expect_like(got, x, "the output")
        expect_like(got_changed, x, "the output")
        moved = (got[:, : t0 + 1] - got_changed[:, : t0 + 1]).abs().amax(dim=(0, 2)) > 1e-9
        if bool(moved.any()):
            t = int(moved.nonzero()[0])
            sees_next = bool(moved[t0]) and not bool(moved[:t0].any())
            raise CaseFailed(
                f"changing the tokens after position {t0} (x[:, {t0 + 1}:]) changed your "
                f"output at position {t}: token t may attend only to tokens 0 .. t, so the "
                "future must not leak into the past. "
                + (
                    f"Only position {t0} moved: {says('causal-mask-sees-next')}"
                    if sees_next
                    else "Is the causal mask applied to the scores before the softmax? "
                    f"... {MERGE_MIXES_TOKENS}"
                )
            )
        if not bool((got[:, t0 + 1 :] - got_changed[:, t0 + 1 :]).abs().amax() > 1e-9):
            raise CaseFailed(
                f"changing the tokens after position {t0} did not change the outputs there "
                "either: each token must attend to itself"
            )

    return run


def _grad_case(candidate, init: dict):
    def run():
        student, reference = _build(candidate, init)
        x = randn(2, 5, init["d_model"], seed=131)
        (mine,), (theirs,) = leaves(x)
        expected = reference(theirs)
        got = _call(student, mine, _what(init, x.shape))
        expect_close(got, expected.detach(), "the output")
        expect_same_grads(got, expected, {"`x`": (mine, theirs)}, (student, reference))

    return run


def _first_token_outputs(module, x, scale: float) -> torch.Tensor:
    """The possible outputs at position 0 when each head's single weight (token 0 sees
    only itself, with weight 1) is dropped or kept and scaled by ``scale``:
    ``(2**H, B, D)``, one row per pattern of dropped heads (bit h set: head h kept)."""
    H, D = module.num_heads, module.d_model
    B = x.shape[0]
    v0 = module.w_v(x[:, :1]).reshape(B, H, D // H)  # (B, H, Dh): token 0's values per head
    outs = []
    for pattern in range(2**H):
        kept = torch.tensor([(pattern >> h) & 1 for h in range(H)], dtype=x.dtype)
        heads = v0 * kept[None, :, None] * scale  # (B, H, Dh)
        outs.append(module.w_o(heads.reshape(B, D)))
    return torch.stack(outs)


def _expect_first_token_dropout(module, x, first, p: float) -> str | None:
    """Token 0 attends only to itself with weight 1, so with dropout on the attention
    weights each head's weight there is 0 or 1 / (1 - p): the output at position 0 is one
    of 2**H vectors. Read which heads were dropped in every call, then check the scale
    and the dropped fraction. ``first`` is ``(draws, B, D)``. The eval output has been
    checked to be right, so an output that fits no pattern in most calls comes from
    dropout somewhere else (on V, on the merged heads): returned as a message, raised
    by the caller once the output-dropout test has had its say."""
    H = module.num_heads
    with torch.no_grad():
        candidates = {
            scale_name: _first_token_outputs(module, x, scale)
            for scale_name, scale in (("right", 1 / (1 - p)), ("unscaled", 1.0), ("1/p", 1 / p))
        }
    clean = candidates["unscaled"][-1]  # every head kept, weight 1
    if all(torch.allclose(f, clean, atol=1e-9, rtol=1e-7) for f in first):
        raise CaseFailed(says("dropout-before-softmax", p=p), mistake="dropout-before-softmax")
    fits = {}
    for scale_name, outs in candidates.items():
        # (draws, B, 1, D) vs (1, B, 2**H, D): which pattern each call matches
        close = torch.isclose(
            first[:, :, None], outs.transpose(0, 1)[None], atol=1e-7, rtol=1e-6
        ).all(-1)  # (draws, B, 2**H)
        fits[scale_name] = float(close.any(-1).all(-1).double().mean())
        if not bool(close.any(-1).all()):
            continue
        pattern = close.to(torch.int64).argmax(-1)  # (draws, B)
        kept = torch.stack([(pattern >> h) & 1 for h in range(H)], -1)  # (draws, B, H)
        dropped = 1.0 - kept.double().mean().item()
        if scale_name == "unscaled":
            raise CaseFailed(
                says("dropout-unscaled", entries="attention weights", scale=1 / (1 - p)),
                mistake="dropout-unscaled",
            )
        if scale_name == "1/p":
            raise CaseFailed(
                says(
                    "dropout-keep-probability",
                    entries="attention weights",
                    p=p,
                    one="a weight",
                    call="`F.dropout(w, p=self.dropout, training=self.training)`",
                ),
                mistake="dropout-keep-probability",
            )
        count = kept.numel()
        slack = 4 * math.sqrt(p * (1 - p) / count) + 0.02
        if abs(dropped - p) > slack:
            raise CaseFailed(
                f"{dropped:.0%} of the attention weights of token 0 were dropped, "
                f"expected about p = {p:.0%} (within {slack:.1%} over {count} weights): "
                "`p` is the probability of dropping a weight, not of keeping it"
            )
        return None
    if max(fits.values()) < 0.5:
        return (
            f"in {1 - max(fits.values()):.0%} of the training-mode calls the output at "
            "position 0 is none of the outputs that dropping whole attention weights can "
            f"give (token 0 attends only to itself, so each of its {H} head weights is 0 or "
            f"1 / (1 - p)): {says('dropout-elsewhere')}"
        )
    return None


def _nan_rows(got) -> torch.Tensor | None:
    """(B, T) bool: the rows of a (B, T, D) output that hold a NaN; None if it has none."""
    if not (isinstance(got, torch.Tensor) and got.is_floating_point() and got.dim() == 3):
        return None
    rows = got.detach().isnan().any(dim=-1)
    return rows if bool(rows.any()) else None


def _nan_likelihood(rows: torch.Tensor, probabilities: torch.Tensor) -> float:
    """Log-likelihood of the NaN rows (draws, B, T) if row t is NaN with probability
    ``probabilities[t]``, independently in each draw and sequence."""
    q = probabilities.clamp(1e-12, 1 - 1e-12)
    n = rows.shape[0] * rows.shape[1]
    k = rows.sum(dim=(0, 1)).double()
    return float((k * q.log() + (n - k) * (1 - q).log()).sum())


def _expect_no_nan_in_training(nan_rows: list, draws: int, p: float, H: int) -> None:
    """NaN in training mode only (the eval output was right). Which rows hold them tells
    two mistakes apart: dropout on the masked scores makes row t NaN when one of its
    T - 1 - t masked scores (in any head) is dropped, -inf * 0, so never the last row;
    renormalising the dropped-out weights makes it NaN when all t + 1 weights of a head
    are dropped, 0 / 0, so nearly always row 0. The likelier of the two is named only when
    it fits the observed frequency of every row."""
    if not nan_rows:
        return
    shape = next(r.shape for _, r in nan_rows)
    rows = torch.zeros(draws, *shape, dtype=torch.bool)
    for i, r in nan_rows:
        rows[i] = r
    count = len(nan_rows)
    message = (
        f"in training mode your output has NaN in {count} of {draws} calls, while the "
        "eval-mode output is right"
    )
    T = shape[-1]
    t = torch.arange(T, dtype=torch.float64)
    models = {
        says("dropout-on-masked-scores"): 1 - (1 - p) ** (H * (T - 1 - t)),
        says("dropout-renormalised"): 1 - (1 - p ** (t + 1)) ** H,
    }
    freq = rows.double().mean(dim=(0, 1))
    scores = {text: _nan_likelihood(rows, q) for text, q in models.items()}
    best = max(scores, key=scores.get)
    others = [v for text, v in scores.items() if text != best]
    fits = float((freq - models[best]).abs().max()) < 0.15
    if fits and all(scores[best] - v > 10 for v in others):
        message += f".\nLikely mistake: {best}."
    else:
        message += (
            " (NaN appears when dropout meets a -inf score, -inf * 0, or a row of weights "
            "is divided by its sum after dropout, 0 / 0).\nHint: apply `F.dropout(weights, "
            "p=self.dropout, training=self.training)` to the weights after the softmax, "
            "and use them as they are."
        )
    raise CaseFailed(message)


def _dropout_case(candidate, init: dict, draws: int = 200):
    """Training mode with dropout on the attention weights, checked by its properties
    (whatever random numbers the student draws): the output is random; it is not the
    clean output with entries zeroed (dropout on the output); and, as inverted dropout
    keeps the expected weights, the mean over ``draws`` calls is the eval output within
    its sampling error."""
    p = init["dropout"]

    def run():
        student, reference = _build(candidate, init)
        reference.eval()
        x = randn(2, 12, init["d_model"], seed=141)
        with torch.no_grad():
            clean = reference(x)
        student.eval()
        eval_out = _call(student, x, _what(init, x.shape) + " in eval mode")
        expect_like(eval_out, clean, "the output")
        if not torch.allclose(eval_out.to(clean.dtype), clean, atol=1e-6, rtol=1e-5):
            raise CaseFailed(
                "your eval-mode output differs from the reference (see the cases above); "
                "fix that first: this case compares the training-mode outputs with it"
            )
        student.train()
        what = _what(init, x.shape) + " in training mode"
        with torch.random.fork_rng(), torch.no_grad():
            torch.manual_seed(_data.case_seed(0))
            outputs, nan_rows = [], []
            for i in range(draws):
                got = _call(student, x, what)
                rows = _nan_rows(got) if getattr(got, "shape", None) == clean.shape else None
                if rows is not None:  # named below, from the rows where NaN appear
                    nan_rows.append((i, rows))
                    continue
                expect_like(got, clean, "the output")
                outputs.append(got.detach().to(torch.float64))
        _expect_no_nan_in_training(nan_rows, draws, p, init["num_heads"])
        stack = torch.stack(outputs)
        if all(torch.allclose(o, clean, atol=1e-9, rtol=1e-7) for o in outputs[:10]):
            raise CaseFailed(
                says(
                    "dropout-never-applied",
                    p=p,
                    what="the attention weights must be dropped out (`F.dropout(weights, "
                    "p=self.dropout, training=self.training)` after the softmax)",
                ),
                mistake="dropout-never-applied",
            )
        elsewhere = _expect_first_token_dropout(reference, x, stack[:, :, 0], p)
        # Dropout on the weights zeroes whole rows at most (all heads dropped, no bias);
        # dropout on the output zeroes single entries of rows that are otherwise alive.
        zeros = (stack.abs() < 1e-12) & (clean.abs() > 1e-12)
        zeros &= ~(stack.abs() < 1e-12).all(dim=-1, keepdim=True)
        if bool(zeros.float().mean() > p / 4):
            raise CaseFailed(
                says("dropout-on-output", share=f"{float(zeros.float().mean()):.0%}"),
                mistake="dropout-on-output",
            )
        if elsewhere:
            raise CaseFailed(elsewhere, mistake="dropout-elsewhere")
        mean = stack.mean(0)
        sem = stack.std(0) / math.sqrt(draws) + 1e-9
        z = ((mean - clean) / sem).pow(2).mean().sqrt()
        if float(z) > 2.0:
            unscaled = (
                "; the kept weights must be scaled by 1 / (1 - p) (inverted dropout, as "
                "F.dropout does), and p is the probability of dropping"
            )
            raise CaseFailed(
                f"the mean of your output over {draws} training-mode calls is not the "
                f"eval-mode output (RMS z-score {float(z):.1f}, expected about 1): inverted "
                "dropout on the attention weights keeps their expected value, so the mean "
                f"output must equal the output without dropout{unscaled}"
            )

    return run


@checker(
    "causal_self_attention",
    "CausalSelfAttention",
    # the statement allows neither
    answer_builtins=(
        "torch.nn.functional.scaled_dot_product_attention",
        "torch.nn.MultiheadAttention",
    ),
    # exercise 13 gives `step_decoder` for `generate`: its GPT is made of the reference
    holds_answer=("attention_course.checks.generation.step_decoder",),
)
def check_causal_self_attention(candidate) -> list[Case]:
    """Check ``CausalSelfAttention(d_model, num_heads, bias=False, dropout=0.0)``:
    ``forward(x (B, T, D)) -> (B, T, D)``, token t attending to tokens 0 .. t."""
    return [
        Case(
            "(B, T, D) = (2, 5, 8), H = 2",
            _compare_case(candidate, _init(), (2, 5, 8), seed=101),
            covers=frozenset({"mode=eval", "B>1"}),
        ),
        Case(
            "odd T = 7, H = 4, D = 16",
            _compare_case(candidate, _init(16, 4), (2, 7, 16), seed=102),
            covers=frozenset({"odd T"}),
        ),
        Case(
            "H = 1",
            _compare_case(candidate, _init(6, 1), (2, 4, 6), seed=103),
            covers=frozenset({"H=1"}),
        ),
        Case(
            "bias=True, H = 2",
            _compare_case(candidate, _init(8, 2, bias=True), (3, 6, 8), seed=104),
            covers=frozenset({"bias"}),
        ),
        Case(
            "T = 1 (a single token attends to itself)",
            _compare_case(candidate, _init(8, 2), (2, 1, 8), seed=105),
            weight=TRIVIAL,
            covers=frozenset({"T=1"}),
        ),
        Case(
            "B = 1, T = 9, H = 3, D = 12, bias=True",
            _compare_case(candidate, _init(12, 3, bias=True), (1, 9, 12), seed=106),
            covers=frozenset({"bias", "odd T"}),
        ),
        Case(
            "causality: later tokens do not change earlier outputs",
            _causality_case(candidate, _init(8, 2)),
            covers=frozenset({"causality"}),
            support=True,
        ),
        Case(
            "dropout=0.2 is off in eval mode",
            _compare_case(candidate, _init(8, 2, dropout=0.2), (2, 6, 8), seed=107),
            covers=frozenset({"dropout", "mode=eval"}),
        ),
        Case(
            "training mode, dropout=0 equals eval",
            _compare_case(candidate, _init(8, 2), (2, 6, 8), seed=108, train=True),
            weight=TRIVIAL,
            covers=frozenset({"mode=train"}),
        ),
        Case(
            "training mode, dropout=0.2: the attention weights are dropped out",
            _dropout_case(candidate, _init(8, 2, dropout=0.2)),
            covers=frozenset({"dropout", "mode=train", "dropout>0 in training"}),
        ),
        Case(
            "gradients reach x and every parameter (bias=True)",
            _grad_case(candidate, _init(8, 2, bias=True)),
            covers=frozenset({"grad", "bias", "mode=train"}),
        ),
    ]
