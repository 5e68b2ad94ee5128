"""Checkers for the exercises' computed questions: the student writes a small function
(or picks a number) that no chapter checker grades, and these cases run it.

Each ``<name>_cases(candidate)`` builds the cases; ``check_<name>(candidate, *, timeout)``
runs them like any checker. The quiz reaches them through
``check_quiz("02.dot_product_attention", fn)`` (see :mod:`attention_course.quiz`), whose
question bank names the cases by ``<name>``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from . import _data
from ._answers import answer_name, is_number, kind, plain, show
from ._compare import expect_close, expect_grad, expect_tuple, fmt_shape
from ._modules import leaves
from ._runner import Case, CaseFailed, call_student, checker, describe_exception


def _as_number(value: object, what: str) -> float:
    try:
        value = plain(value)
    except Exception as error:  # noqa: BLE001 - an unreadable answer is the answer's fault
        raise CaseFailed(
            f"{what} returned a {type(value).__name__} that is not a number "
            f"({type(error).__name__}: {error})"
        ) from None
    if not is_number(value):
        raise CaseFailed(f"{what} returned {kind(value)}: expected a number")
    if isinstance(value, int) and abs(value) > 1e300 or not math.isfinite(value):
        raise CaseFailed(f"{what} returned {show(value)}: expected a finite number")
    return float(value)


def _digits(value: float, bound: float) -> str:
    """``value`` with enough digits that it does not print as ``bound``: 0.09987, not 0.100."""
    for places in range(3, 10):
        text = f"{value:.{places}f}"
        if value == bound or float(text) != bound:
            return text
    return repr(value)


# ---------------------------------------------------------------- chapter 1: tune beta

# Three tokens on the unit circle: token 1 is a near-twin of token 0.
BETA_TOKENS = ((1.0, 0.0), (0.8, 0.6), (0.0, 1.0))


def chosen_beta_cases(candidate: Callable) -> list[Case]:
    """Cases for a function returning a ``beta`` for chapter 1's three tokens."""
    from attention_course.attention import set_attention

    X = torch.tensor(BETA_TOKENS, dtype=torch.float64)
    found: dict[str, torch.Tensor] = {}

    def weights() -> torch.Tensor:
        if "A" not in found:
            what = f"{answer_name(candidate)}()"
            beta = _as_number(call_student(candidate, what=what), what)
            if beta <= 0:
                raise CaseFailed(f"{what} returned {beta:g}: beta must be positive")
            found["beta"] = beta
            found["A"] = set_attention(X, beta=beta)[1]
        return found["A"]

    def self_weight() -> str:
        A = weights()
        diagonal = A.diagonal()
        if bool((diagonal < 0.7).any()):
            worst = int(diagonal.argmin())
            raise CaseFailed(
                f"with beta={found['beta']:g} token {worst} keeps only "
                f"{_digits(diagonal[worst].item(), 0.7)} of its weight for itself "
                "(needs >= 0.7): a larger beta sharpens the weights"
            )
        return f"self-weights {[round(v, 3) for v in diagonal.tolist()]}"

    def twin_weight() -> str:
        A = weights()
        if A[0, 1].item() < 0.1:
            raise CaseFailed(
                f"with beta={found['beta']:g} token 0 gives only {_digits(A[0, 1].item(), 0.1)} "
                "to its near-twin token 1 (needs >= 0.1): beta is so large that attention "
                "is almost hard; make it smaller"
            )
        return f"token 0 -> token 1: {A[0, 1].item():.3f}"

    return [
        Case("every token keeps >= 70% for itself", self_weight),
        Case("token 0 still gives >= 10% to token 1", twin_weight),
    ]


# ---------------------------------------------------------------- chapter 2: dot-product attention


def _inputs(*shapes: tuple[int, ...], seed: int, dtype: torch.dtype) -> list[torch.Tensor]:
    gen = _data.generator(seed)
    return [torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype) for shape in shapes]


def _expect_grads(
    got: torch.Tensor,
    expected: torch.Tensor,
    name: str,
    seed: int,
    names: tuple[str, ...],
    mine: tuple[torch.Tensor, ...],
    theirs: tuple[torch.Tensor, ...],
) -> None:
    """Backpropagate the same random upstream gradient through the student's and the
    reference's ``name`` (failing, with the likely cause, when no graph is attached), then
    compare the gradients of the inputs ``names``: the student's leaves ``mine`` with the
    reference's ``theirs``."""
    gen = _data.generator(seed)
    upstream = torch.randn(expected.shape, generator=gen, dtype=torch.float64)
    expected.backward(upstream.to(expected.dtype))
    if not got.requires_grad:
        raise CaseFailed(
            f"{name} does not require grad, so no gradient can flow back to the inputs: "
            "it was computed under `torch.no_grad()` (or through `.detach()`, `.data`, "
            "`.item()` or `.numpy()`); compute it with tensor operations that autograd follows"
        )
    try:
        got.backward(upstream.to(got.dtype))
    except Exception as error:  # noqa: BLE001 - a broken graph is the student's, not ours
        raise CaseFailed(
            describe_exception(error, f"backpropagating through your {name}")
        ) from None
    for input_name, a, b in zip(names, mine, theirs, strict=True):
        expect_grad(a.grad, b.grad, input_name)


def _expect_close(got: object, expected: torch.Tensor, name: str, **options) -> None:
    """`expect_close`, with a student's output that cannot even be compared (a tensor on
    the ``meta`` device, say) turned into a failed case rather than a checker failure."""
    try:
        expect_close(got, expected, name, **options)
    except CaseFailed:
        raise
    except Exception as error:  # noqa: BLE001 - the output is the student's
        raise CaseFailed(
            f"{name}: cannot be compared with the expected values ({type(error).__name__}: {error})"
        ) from None


DTYPE_HINT = (
    "keep the inputs' dtype: build new tensors with `dtype=x.dtype` (the checker uses "
    "float64 and float32 inputs)"
)


def dot_product_attention_cases(candidate: Callable) -> list[Case]:
    """Cases for ``dot_product_attention(query, key, value) -> (output, weights)`` (unscaled)."""
    from attention_course.attention import scaled_dot_product_attention

    def run_with(
        shapes: tuple[tuple[int, ...], ...], seed: int, dtype=torch.float64, grad: bool = False
    ) -> Callable[[], None]:
        def run() -> None:
            q, k, v = _inputs(*shapes, seed=seed, dtype=dtype)
            mine, theirs = leaves(q, k, v, grad=grad)
            want_out, want_w = scaled_dot_product_attention(*theirs, scale=1.0)
            names = ("query", "key", "value")
            shown = ", ".join(f"{n} {fmt_shape(t.shape)}" for n, t in zip(names, (q, k, v)))
            call = f"dot_product_attention({shown})"
            hint = None
            if q.dim() > 2:
                hint = (
                    "with batch axes, transpose only the last two axes of the keys, "
                    "`query @ key.transpose(-2, -1)`: `key.T` reverses every axis"
                )
            result = call_student(candidate, *mine, what=call, arg_names=names, error_hint=hint)
            output, weights = expect_tuple(result, 2, call, ("output", "weights"))
            scores = q @ k.transpose(-2, -1)  # (..., T, Dk) @ (..., Dk, S) -> (..., T, S)
            _expect_close(
                weights,
                want_w,
                "weights",
                dtype_hint=DTYPE_HINT,
                mistakes=[
                    (
                        "you returned (weights, output): return (output, weights), in that order",
                        lambda: want_out,
                    ),
                    (
                        "your weights are scaled by 1/sqrt(d_k): that is chapter 4's "
                        "attention; here the scores are the plain dot products q . k",
                        lambda: scaled_dot_product_attention(q, k, v)[1],
                    ),
                    (
                        "softmax over the wrong axis: your weights sum to 1 over the queries "
                        "(dim=-2); take the softmax over the last axis, the keys",
                        lambda: torch.softmax(scores, dim=-2),
                    ),
                    (
                        "no softmax: your weights are the raw scores q . k; a softmax over "
                        "the keys turns them into weights that sum to 1",
                        lambda: scores,
                    ),
                    (
                        "transposed keys: you computed key @ query^T, one row per key; the "
                        "scores are query @ key^T, one row per query",
                        lambda: torch.softmax(k @ q.transpose(-2, -1), dim=-1),
                    ),
                ],
            )
            w = want_w.detach()
            _expect_close(
                output,
                want_out,
                "output",
                dtype_hint=DTYPE_HINT,
                mistakes=[
                    (
                        "the output averages the scores' rows, not the weights': "
                        "output = weights @ value",
                        lambda: scores @ v,
                    ),
                    (
                        "you averaged the keys, not the values: output = weights @ value",
                        lambda: w @ k,
                    ),
                    ("you returned the queries unchanged: output = weights @ value", lambda: q),
                ],
            )
            if grad:
                grads = ("`query`", "`key`", "`value`")
                _expect_grads(output, want_out, "output", seed + 1, grads, mine, theirs)

        return run

    return [
        Case("one query set (no batch axis), T == S", run_with(((4, 3), (4, 3), (4, 3)), 1)),
        Case("batched, T != S, Dk != Dv", run_with(((2, 3, 4), (2, 5, 4), (2, 5, 6)), 2)),
        Case("two batch axes, T = 1", run_with(((2, 2, 1, 4), (2, 2, 5, 4), (2, 2, 5, 3)), 3)),
        Case(
            "float32 inputs give float32 results",
            run_with(((2, 3, 4), (2, 5, 4), (2, 5, 3)), 4, dtype=torch.float32),
        ),
        Case(
            "gradients flow to query, key and value",
            run_with(((2, 3, 4), (2, 5, 4), (2, 5, 6)), 5, grad=True),
        ),
    ]


# ---------------------------------------------------------------- chapter 11: pooling


def masked_mean_pool_cases(candidate: Callable) -> list[Case]:
    """Cases for ``masked_mean_pool(x, mask) -> pooled``, compared with the classifier's."""
    from attention_course.classifier import masked_mean_pool
    from attention_course.masking import padding_mask

    def run_with(
        lengths: list[int], T: int, seed: int, dtype=torch.float64, grad: bool = False
    ) -> Callable[[], str]:
        def run() -> str:
            (x,) = _inputs((len(lengths), T, 4), seed=seed, dtype=dtype)
            mask = padding_mask(torch.tensor(lengths), max_len=T)  # (B, T), True at real tokens
            (mine,), (theirs,) = leaves(x, grad=grad)
            want = masked_mean_pool(theirs, mask)
            call = f"masked_mean_pool(x {fmt_shape(x.shape)}, mask {fmt_shape(mask.shape)})"
            got = call_student(candidate, mine, mask, what=call, arg_names=("x", "mask"))
            keep = mask.to(x.dtype).unsqueeze(-1)  # (B, T) -> (B, T, 1)
            count = keep.sum(dim=1)  # (B, 1) real tokens per sequence
            full = bool(mask.all())

            def eps_hint(g: torch.Tensor) -> str | None:
                """An epsilon added to the count: got = sum / (count + eps)."""
                g, w = g.to(torch.float64), want.detach().to(torch.float64)
                if g.shape != w.shape:
                    return None
                sel = (w.abs() > 1e-3) & (g.abs() > 1e-12)
                eps = ((w / g.where(sel, torch.ones_like(g)) - 1) * count)[sel]
                if eps.numel() == 0 or float(eps.min()) <= 0 or float(eps.max()) > 1:
                    return None
                if float(eps.max() - eps.min()) > 1e-3 * float(eps.max()):
                    return None
                return (
                    f"you divide by (count + {float(eps.mean()):.0e}): an epsilon in the "
                    "denominator changes every mean; to avoid 0 / 0 for a sequence with no "
                    "real token use `count.clamp(min=1)` instead"
                )

            _expect_close(
                got,
                want,
                "the pooled vectors",
                dtype_hint=DTYPE_HINT,
                hints=[eps_hint],
                mistakes=[
                    (
                        "you averaged over every position, padding included (`x.mean(dim=1)`): "
                        "multiply by the mask and divide by the number of real tokens",
                        lambda: x.mean(dim=1),
                    ),
                    (
                        "you zeroed the padding but divided by T: divide by the number of "
                        "real tokens in each sequence",
                        lambda: (x * keep).sum(dim=1) / T,
                    ),
                    (
                        "you divided by the number of real tokens but summed the padding "
                        "too: multiply x by the mask before summing",
                        lambda: x.sum(dim=1) / count.clamp(min=1.0),
                    ),
                    (
                        "you summed the real tokens but did not divide by their number",
                        lambda: (x * keep).sum(dim=1),
                    ),
                    (
                        "a sequence with no real token divides 0 by 0: clamp the count to "
                        "at least 1, so that it gives zeros",
                        lambda: (x * keep).sum(dim=1) / count,
                    ),
                    (
                        "your mask is inverted: True marks the real tokens, so average where "
                        "the mask is True"
                        + (" (here every token is real, and you returned zeros)" if full else ""),
                        lambda: masked_mean_pool(x, ~mask),
                    ),
                    (
                        "`keepdim=True` left a time axis of size 1: return (B, D)",
                        lambda: want.detach().unsqueeze(1),
                    ),
                    (
                        "you averaged over the features (the last axis); average over the "
                        "tokens, dim=1",
                        lambda: x.mean(dim=-1),
                    ),
                ],
            )
            if grad:
                _expect_grads(got, want, "pooled output", seed + 1, ("`x`",), (mine,), (theirs,))
            return ""

        return run

    return [
        Case("no padding", run_with([5, 5], 5, 1)),
        Case("different lengths", run_with([5, 2, 3], 5, 2)),
        Case("a sequence with no real token gives zeros", run_with([3, 0], 4, 3)),
        Case("one sequence of one token", run_with([1], 1, 4)),
        Case("float32 x gives a float32 result", run_with([4, 1, 3], 4, 5, dtype=torch.float32)),
        Case("gradient flows to x (and not to padding)", run_with([4, 2], 4, 6, grad=True)),
    ]


# ---------------------------------------------------------------- chapter 15: Mistral's cache

# Mistral 7B (Jiang et al., 2023, Table 1): 32 layers, 8 key/value heads of size 128, a
# window of 4,096 with a rolling buffer of exactly 4,096 slots; bfloat16 (2 bytes).
MISTRAL = {"layers": 32, "heads": 32, "kv_heads": 8, "d_head": 128, "window": 4096, "bytes": 2}
MISTRAL_TOKENS = (1, 3000, 4096, 4097, 20000)


def _mistral_per_token(kv_heads: int = 8, bytes_per_number: int = 2, layers: int = 32) -> int:
    return 2 * layers * kv_heads * MISTRAL["d_head"] * bytes_per_number


def mistral_cache_bytes_reference(tokens: int) -> int:
    """Bytes of keys and values in Mistral 7B's rolling buffer after ``tokens`` tokens."""
    return _mistral_per_token() * min(tokens, MISTRAL["window"])


def _mistral_mistakes() -> list[tuple[str, Callable[[int], float], float]]:
    """(what the answer shows, the wrong formula of the length t, relative tolerance; a
    tolerance of -1 means "within 1 %, written with at most 4 significant digits")."""
    P, W = _mistral_per_token(), MISTRAL["window"]
    right = mistral_cache_bytes_reference
    units = [
        ("KiB", 2**10),
        ("MiB", 2**20),
        ("GiB", 2**30),
        ("kB", 10**3),
        ("MB", 10**6),
        ("GB", 10**9),
    ]
    return [
        (
            "you counted every token: the rolling buffer keeps only the last 4,096 positions "
            "(position p goes to slot p mod 4,096, overwriting the one 4,096 older)",
            lambda t: P * t,
            0.0,
        ),
        (
            "the buffer is not full before 4,096 tokens: after t tokens it holds t positions, "
            "not 4,096",
            lambda t: P * W,
            0.0,
        ),
        (
            "the rolling buffer has exactly W = 4,096 slots, not 4,097 (position p goes to "
            "slot p mod 4,096); the paper's wording 'positions i - W to i' does not add a slot",
            lambda t: P * min(t, W + 1),
            0.0,
        ),
        (
            "the buffer has 4,096 slots (window = 4,096), not window - 1 = 4,095",
            lambda t: P * min(t, W - 1),
            0.0,
        ),
        (
            "you counted one position too many (min(t + 1, 4,096)): after t tokens the buffer "
            "holds t positions, 0 .. t - 1, until it is full",
            lambda t: P * min(t + 1, W),
            0.0,
        ),
        (
            "you used t mod 4,096, the slot of the next position, as the count: once full the "
            "buffer keeps holding 4,096 positions, min(t, 4,096)",
            lambda t: P * (t % W),
            0.0,
        ),
        ("that is in bits: 8 times the bytes", lambda t: 8 * right(t), 0.0),
        (
            "you used the 32 query heads: the cache stores only the 8 key/value heads, which "
            "the query heads share",
            lambda t: 4 * right(t),
            0.0,
        ),
        (
            "you used the 32 query heads and counted every token: the cache stores only the 8 "
            "key/value heads, and only the last 4,096 positions",
            lambda t: 4 * P * t,
            0.0,
        ),
        (
            "you counted only the keys (or only the values): the cache stores both, hence the "
            "factor 2",
            lambda t: right(t) / 2,
            0.0,
        ),
        ("that is 4 bytes per number (float32); bfloat16 takes 2", lambda t: 2 * right(t), 0.0),
        ("that is one layer; Mistral 7B has 32", lambda t: right(t) / 32, 0.0),
        ("that is the cost of one token, whatever the length", lambda t: P, 0.0),
        *(
            (
                f"that is the answer in {name} (1 {name} = {size:,} bytes); the task asks for "
                "bytes",
                lambda t, size=size: right(t) / size,
                1e-2,
            )
            for name, size in units
        ),
        (
            "close, but rounded: return the exact number of bytes, an integer",
            lambda t: right(t),
            -1.0,
        ),
    ]


def mistral_cache_bytes_cases(candidate: Callable) -> list[Case]:
    """Cases for ``mistral_cache_bytes(tokens) -> int``: the bytes of Mistral 7B's rolling
    KV cache after ``tokens`` tokens (batch 1, bfloat16). A known mistake is named only
    when it alone explains the answers at every length the checker tried (at 32,768
    tokens "every token counted" and "bits" would both give 8 times the answer; at 3,000
    they differ), or, failing that, alone explains the answer at this length."""
    answers: dict[int, object] = {}

    def answer(t: int) -> object:
        """The student's answer at ``t`` as an int or float, or a CaseFailed to raise."""
        if t not in answers:
            what = f"{answer_name(candidate)}({t})"
            try:
                raw = call_student(candidate, t, what=what)
                answers[t] = _whole_number(raw, what)
            except CaseFailed as error:
                answers[t] = error
        return answers[t]

    def matches(value: float, formula: Callable[[int], float], rel: float, t: int) -> bool:
        want = formula(t)
        if rel < 0:  # rounded: near the answer, and a short number
            return abs(value - want) <= 1e-2 * abs(want) and float(f"{value:.4g}") == value
        return abs(value - want) <= rel * abs(want) if rel else value == want

    def run_with(t: int) -> Callable[[], str]:
        def run() -> str:
            got = answer(t)
            if isinstance(got, CaseFailed):
                raise got
            right = mistral_cache_bytes_reference(t)
            if got == right:
                return ""
            what = f"{answer_name(candidate)}({t})"
            ratio = got / right
            message = f"{what} returned {got if isinstance(got, int) else repr(got)}"
            if isinstance(got, float) and not got.is_integer():
                message += ", not a whole number of bytes"
            if abs(ratio - 1) > 1e-4:
                message += f", {ratio:.6g} times the right number"
            else:
                message += ", close to the right number but not equal"
            others = {s: answer(s) for s in MISTRAL_TOKENS}
            here = [
                (text, formula, rel)
                for text, formula, rel in _mistral_mistakes()
                if (formula(t) != right or rel < 0) and matches(got, formula, rel, t)
            ]
            everywhere = {
                text
                for text, formula, rel in here
                if all(
                    matches(value, formula, rel, s)
                    for s, value in others.items()
                    if not isinstance(value, CaseFailed)
                )
            }
            named = everywhere or {text for text, _, _ in here}
            if len(named) == 1:
                message += f"\nLikely mistake: {named.pop()}."
            raise CaseFailed(message)

        return run

    return [
        Case("after 1 token", run_with(1)),
        Case("after 3,000 tokens: the buffer not yet full", run_with(3000)),
        Case("after 4,096 tokens: the buffer just full", run_with(4096)),
        Case("after 4,097 tokens: the first slot overwritten", run_with(4097)),
        Case("after 20,000 tokens", run_with(20000)),
    ]


def _is_vector(raw: object) -> bool:
    """A 1-d numpy array or torch tensor (an answer given as one array of numbers)."""
    if isinstance(raw, torch.Tensor):
        return raw.dim() == 1
    return type(raw).__module__ == "numpy" and getattr(raw, "ndim", None) == 1


def _is_float(value: object) -> bool:
    """Whether ``value`` is a floating-point number (Python, numpy or torch)."""
    if isinstance(value, torch.Tensor):
        return value.is_floating_point()
    return isinstance(plain(value), float)


def _whole_number(raw: object, what: str) -> int | float:
    """``raw`` as an int (or a float that is not whole, for the message); an integral
    float, ``Fraction`` or ``Decimal`` counts as that int."""
    from decimal import Decimal
    from fractions import Fraction

    if raw is None:
        raise CaseFailed(f"{what} returned None: return the number of bytes, an int")
    if isinstance(raw, Decimal) and not raw.is_finite():
        raise CaseFailed(f"{what} returned Decimal({raw}): expected a finite number of bytes")
    if isinstance(raw, (Fraction, Decimal)):
        return int(raw) if raw == int(raw) else float(raw)
    value = _as_number(raw, what)  # a plain, finite number (numpy and torch scalars too)
    plain_raw = plain(raw)
    if isinstance(plain_raw, int) and not isinstance(plain_raw, bool):
        return plain_raw
    return int(value) if value.is_integer() else value


# ---------------------------------------------------------------- chapter 14: RoPE in attention


def _rope_attend(
    q,
    k,
    v,
    *,
    rotate: str = "qk",
    causal: str | bool = True,
    scaled: str | bool = True,
    fill: float = float("-inf"),
    softmax_dim: int = -1,
):
    """Causal attention with RoPE, the right way (``rotate="qk"``) or a known mistake:
    ``causal="reversed"`` hides the past, ``"diagonal"`` the key j = t too;
    ``scaled="Dh"`` divides by Dh; ``fill`` is the masked scores' value."""
    from attention_course.relative_positions import apply_rope

    T = q.shape[-2]
    if "q" in rotate:
        q = apply_rope(q)
    if "k" in rotate:
        k = apply_rope(k)
    if "v" in rotate:
        v = apply_rope(v)
    scores = q @ k.transpose(-2, -1)  # (..., T, T)
    if scaled == "Dh":
        scores = scores / q.shape[-1]
    elif scaled:
        scores = scores / math.sqrt(q.shape[-1])
    if causal:
        hidden = {
            "reversed": torch.ones(T, T, dtype=torch.bool).tril(-1),
            "diagonal": torch.ones(T, T, dtype=torch.bool).triu(0),
        }.get(causal, torch.ones(T, T, dtype=torch.bool).triu(1))
        scores = scores.masked_fill(hidden, fill)
    return scores.softmax(dim=softmax_dim) @ v


def rope_attention_cases(candidate: Callable) -> list[Case]:
    """Cases for ``rope_attention(q, k, v) -> output``: causal scaled dot-product
    attention with RoPE (``apply_rope`` at positions ``0 .. T-1``) on q and k only."""

    def run_with(shape: tuple[int, ...], seed: int, dtype=torch.float64, grad: bool = False):
        def run() -> None:
            q, k, v = _inputs(shape, shape, shape, seed=seed, dtype=dtype)
            mine, theirs = leaves(q, k, v, grad=grad)
            want = _rope_attend(*theirs)
            call = f"rope_attention(q, k, v), each {fmt_shape(shape)}"
            got = call_student(candidate, *mine, what=call, arg_names=("q", "k", "v"))

            def variant(**options):
                return lambda: _rope_attend(q, k, v, **options)

            _expect_close(
                got,
                want.detach(),
                f"the output of {call}",
                dtype_hint=DTYPE_HINT,
                mistakes=[
                    (
                        "RoPE is applied to the values as well: rotate q and k only; the "
                        "values carry content, and only the scores need the offset",
                        variant(rotate="qkv"),
                    ),
                    ("only the queries are rotated: rotate the keys too", variant(rotate="q")),
                    ("only the keys are rotated: rotate the queries too", variant(rotate="k")),
                    (
                        "no rotation: apply_rope to q and k before the scores",
                        variant(rotate=""),
                    ),
                    (
                        "no causal mask: fill the scores of keys j > t with -inf before the "
                        "softmax",
                        variant(causal=False),
                    ),
                    ("the scores are not divided by sqrt(Dh)", variant(scaled=False)),
                    (
                        "the scores are divided by Dh instead of sqrt(Dh)",
                        variant(scaled="Dh"),
                    ),
                    (
                        "the mask is reversed: it hides the keys j < t (the past); hide the "
                        "future keys j > t, `torch.ones(T, T, dtype=torch.bool).triu(1)`",
                        variant(causal="reversed"),
                    ),
                    (
                        "the mask hides the diagonal too (key j = t), so query 0 sees no key "
                        "at all: hide only j > t, `triu(1)`, not `triu(0)`",
                        variant(causal="diagonal"),
                    ),
                    (
                        "masked scores set to 0 still get weight in the softmax: fill them "
                        "with -inf",
                        variant(fill=0.0),
                    ),
                    (
                        "the softmax runs over the queries (dim=-2): each query's weights "
                        "over the keys must sum to 1, `softmax(dim=-1)`",
                        variant(softmax_dim=-2),
                    ),
                ],
            )
            if grad:
                _expect_grads(got, want, "output", seed + 1, ("`q`", "`k`", "`v`"), mine, theirs)

        return run

    return [
        Case("q, k, v (6, 8): no batch axis", run_with((6, 8), 1)),
        Case("q, k, v (2, 3, 5, 4): batch and head axes", run_with((2, 3, 5, 4), 2)),
        Case("float32 inputs give float32 results", run_with((2, 7, 6), 3, dtype=torch.float32)),
        Case("T = 1: one position", run_with((2, 1, 4), 4)),
        Case("gradients flow to q, k and v", run_with((2, 5, 8), 5, grad=True)),
    ]


# ---------------------------------------------------------------- chapter 21: MoE parameters

# (d_model, d_ff, num_experts, top_k, num_shared): small ones, Mixtral 8x7B's layer
# (Jiang et al. 2024, Table 1: dim 4096, hidden_dim 14336, 8 experts, top-2), many small
# experts with a shared one, every expert active
MOE_CONFIGS = (
    (8, 6, 4, 2, 0),
    (4096, 14336, 8, 2, 0),
    (1024, 512, 64, 6, 2),
    (16, 8, 3, 3, 1),
    (512, 256, 32, 1, 1),
)


def moe_parameters_reference(d_model, d_ff, num_experts, top_k, num_shared) -> tuple[int, int]:
    """(total, active per token) parameters of ``MoE(d_model, d_ff, num_experts, top_k,
    num_shared)``: each SwiGLU expert has 3 bias-free D x F matrices, the shared network
    3 D x (num_shared F), the router D x E; a token uses the router, its k experts and the
    shared network."""
    expert = 3 * d_model * d_ff
    router = d_model * num_experts
    total = expert * (num_experts + num_shared) + router
    return total, expert * (top_k + num_shared) + router


def _moe_parameter_mistakes(D, F, E, k, S):
    right_total, right_active = moe_parameters_reference(D, F, E, k, S)
    expert, router = 3 * D * F, D * E
    return [
        ("the two numbers are swapped: return (total, active)", (right_active, right_total)),
        (
            "the router is not counted: it is an nn.Linear(d_model, num_experts) of D * E "
            "weights, and every token uses it",
            (right_total - router, right_active - router),
        ),
        (
            "the router is left out of the active count: every token goes through it",
            (right_total, right_active - router),
        ),
        (
            "each expert has three matrices (SwiGLU: w1, w3, w2), not two",
            (2 * D * F * (E + S) + router, 2 * D * F * (k + S) + router),
        ),
        (
            "the shared experts are not counted: every token also goes through them",
            (expert * E + router, expert * k + router),
        ),
        (
            "the shared experts are counted as one expert of width d_ff: they are one network "
            "of width num_shared * d_ff",
            (expert * (E + min(S, 1)) + router, expert * (k + min(S, 1)) + router),
        ),
        (
            "the shared experts are counted in the total but not in the active count: every "
            "token goes through them, so all of them are active",
            (right_total, expert * k + router),
        ),
        (
            "the active count is not the total times k / E: the router and the shared "
            "experts are used by every token, only the routed experts are sparse",
            (right_total, right_total * k // E),
        ),
    ]


def moe_parameters_cases(candidate: Callable) -> list[Case]:
    """Cases for ``moe_parameters(d_model, d_ff, num_experts, top_k, num_shared) ->
    (total, active)``, compared exactly (numpy and torch integers count as ints)."""

    def run_with(config):
        def run() -> None:
            D, F, E, k, S = config
            what = f"{answer_name(candidate)}{config}"
            raw = call_student(candidate, *config, what=what)
            if _is_vector(raw):  # an array or tensor of the two, as quiz 20 accepts
                raw = tuple(raw)
            got = expect_tuple(raw, 2, what, ("total", "active"))
            floats = [_is_float(v) for v in got]
            got = tuple(_whole_number(v, what) for v in got)
            right = moe_parameters_reference(*config)
            if got == right:
                return
            shown = (
                "("
                + ", ".join(
                    repr(float(v)) if f else str(v) for v, f in zip(got, floats, strict=True)
                )
                + ")"
            )
            message = f"{what} returned {shown}, expected other numbers"
            for text, wrong in _moe_parameter_mistakes(*config):
                if wrong != right and got == wrong:
                    message += f"\nLikely mistake: {text}."
                    break
            else:
                if any(floats):
                    message += (
                        "\nHint: give exact integers: your answer holds floats, and the counts "
                        "are compared exactly; a float rounds (1.41e9 is not 1409318912), so "
                        "compute with ints (`3 * d_model * d_ff`, `//` rather than `/`, no "
                        "rounding)"
                    )
            raise CaseFailed(message)

        return run

    names = (
        "a small layer: D=8, F=6, E=4, top_k=2",
        "Mixtral 8x7B's layer: D=4096, F=14336, E=8, top_k=2",
        "64 small experts, top_k=6, two shared",
        "top_k = E = 3 and one shared: every expert active",
        "top_k=1 with one shared expert",
    )
    return [Case(name, run_with(c)) for name, c in zip(names, MOE_CONFIGS, strict=True)]


# ---------------------------------------------------------------- chapter 22: a state or a cache

# (tokens, delta_heads, d_key, d_value, kv_heads, d_head, bytes_per_number). Qwen3-Next's
# defaults in Hugging Face's Qwen3NextConfig: 32 value heads of 128 x 128 in each gated
# delta layer (its state has one (Dk, Dv) matrix per value head); full-attention layers
# with 2 key/value heads of 256; bfloat16 (2 bytes).
QWEN3_NEXT = (32, 128, 128, 2, 256, 2)


def state_or_cache_reference(
    tokens, delta_heads, d_key, d_value, kv_heads, d_head, bytes_per_number
) -> tuple[int, int, int]:
    """(the bytes of one gated-delta layer's state, the bytes of one softmax-attention
    layer's key/value cache after ``tokens`` tokens, the first length at which the cache
    is larger than the state), for one sequence."""
    state = delta_heads * d_key * d_value  # numbers: one (Dk, Dv) matrix per head
    per_token = 2 * kv_heads * d_head  # numbers: a key and a value per kv head
    return (
        state * bytes_per_number,
        per_token * tokens * bytes_per_number,
        state // per_token + 1,  # the first T with per_token * T > state
    )


def _state_or_cache_mistakes(T, H, Dk, Dv, Hkv, Dh, b):
    right = state_or_cache_reference(T, H, Dk, Dv, Hkv, Dh, b)
    state, per_token = H * Dk * Dv, 2 * Hkv * Dh
    return [
        (
            "the cache holds a key AND a value per token and kv head: 2 * kv_heads * d_head "
            "numbers per token, not kv_heads * d_head",
            (right[0], right[1] // 2, state // (per_token // 2) + 1),
        ),
        (
            "the state does not grow with the tokens: it is one (d_key, d_value) matrix per "
            "head, whatever the length (that is the point of a fixed-size state)",
            (right[0] * T, right[1], right[2]),
        ),
        (
            "numbers, not bytes: multiply the state and the cache by bytes_per_number",
            (state, per_token * T, right[2]),
        ),
        (
            "the first length is where the cache is larger, strictly: at T = state / "
            "(2 * kv_heads * d_head) the two are equal, so the answer is one more",
            (right[0], right[1], -(-state // per_token)),
        ),
        (
            "the first length is where the cache is larger, strictly: at T = state / "
            "(2 * kv_heads * d_head) the two are equal, so the answer is one more",
            (right[0], right[1], state // per_token),
        ),
        (
            "the first length compares bytes with numbers: the state in numbers, the cache "
            "in bytes (or the other way round); compare like with like",
            (right[0], right[1], state // (per_token * b) + 1),
        ),
        (
            "the first length compares bytes with numbers: the state in numbers, the cache "
            "in bytes (or the other way round); compare like with like",
            (right[0], right[1], state * b // per_token + 1),
        ),
        (
            "the state is counted twice, as if it held keys and values: it is one "
            "(d_key, d_value) matrix per head",
            (2 * right[0], right[1], 2 * state // per_token + 1),
        ),
        (
            "bits, not bytes: bytes_per_number is already in bytes, so state and cache are "
            "numbers * bytes_per_number, with no factor 8",
            (8 * right[0], 8 * right[1], right[2]),
        ),
        (
            "the sizes take 2 bytes a number whatever bytes_per_number says (bfloat16 "
            "fixed): multiply by the argument bytes_per_number (4 for float32, 1 for 8-bit)",
            (2 * state, 2 * per_token * T, right[2]),
        ),
    ]


def _drawn_state_config(seed: int) -> tuple[int, ...]:
    """A configuration drawn from the run seed (`_data.generator`): powers of two for the
    head sizes, so that the state is a whole number of tokens' worth of cache (the case where
    'larger' and 'at least as large' differ); a drawn length."""
    g = _data.generator(seed)

    def pick(*values):
        return values[int(torch.randint(len(values), (1,), generator=g))]

    H = pick(4, 8, 16, 32, 48)
    Dk = pick(32, 64, 128, 256)
    Dv = pick(32, 64, 128, 256)
    Hkv = pick(1, 2, 4, 8)
    Dh = pick(64, 128, 256)
    b = pick(1, 2, 4)
    T = int(torch.randint(1, 100_000, (1,), generator=g))
    return (T, H, Dk, Dv, Hkv, Dh, b)


STATE_CACHE_CASES = (
    (
        "Qwen3-Next's layers (32 delta heads of 128 x 128; 2 kv heads of 256), T=32768, bf16",
        (32768, *QWEN3_NEXT),
    ),
    ("the same layers at T=512, where the cache equals the state", (512, *QWEN3_NEXT)),
    (
        "a state that is not a whole number of tokens' cache: H=3, Dk=Dv=10, 1 kv head of 7, "
        "float32",
        (5, 3, 10, 10, 1, 7, 4),
    ),
)


def state_or_cache_cases(candidate: Callable) -> list[Case]:
    """Cases for ``state_or_cache(tokens, delta_heads, d_key, d_value, kv_heads, d_head,
    bytes_per_number) -> (state_bytes, cache_bytes, first_length)``, compared exactly;
    two configurations drawn from the run seed."""

    def run_with(config=None, drawn_seed=None):
        def run() -> None:
            nonlocal config
            if config is None:
                config = _drawn_state_config(drawn_seed)
            what = f"{answer_name(candidate)}{tuple(config)}"
            raw = call_student(candidate, *config, what=what)
            if _is_vector(raw):
                raw = tuple(raw)
            got = expect_tuple(raw, 3, what, ("state_bytes", "cache_bytes", "first_length"))
            floats = [_is_float(v) for v in got]
            got = tuple(_whole_number(v, what) for v in got)
            right = state_or_cache_reference(*config)
            if got == right:
                return
            message = f"{what} returned {got}, expected other numbers"
            for text, wrong in _state_or_cache_mistakes(*config):
                if wrong != right and got == wrong:
                    message += f"\nLikely mistake: {text}."
                    break
            else:
                if any(floats):
                    message += (
                        "\nHint: give exact integers: the numbers are compared exactly, and a "
                        "float counts only when it holds the exact integer (`1048576.0`); a "
                        "fraction from `/` or a rounded float (`1.05e6`) does not, so use `//`, "
                        "not `/` and rounding"
                    )
                elif got[:2] == right[:2]:
                    message += (
                        "\nHint: the two sizes are right; the first length is the smallest "
                        "T at which 2 * kv_heads * d_head * T numbers exceed the state's"
                    )
            raise CaseFailed(message)

        return run

    cases = [Case(name, run_with(config)) for name, config in STATE_CACHE_CASES]
    cases += [
        Case(f"a configuration drawn from the run seed ({i})", run_with(drawn_seed=seed))
        for i, seed in enumerate((2501, 2511), start=1)
    ]
    return cases


# ---------------------------------------------------------------- chapter 23: ring costs

# The chapter's long-context layer (B = 1, H = 32, T = 2**20 tokens on W = 8 ranks,
# Dh = 128, bfloat16): 2 GiB per rank per step.
RING_CHAPTER_CONFIG = (1, 32, 2**20, 8, 128, 2)


def ring_costs_reference(B, H, T, W, Dh, bytes_per_number) -> tuple[int, int, float]:
    """(bytes one rank sends per forward step, the bytes it sends in the whole forward
    pass, the share of the causal work (unmasked query-key pairs) its busiest rank does in
    the contiguous layout), chapter 23's formulas with Dk = Dv = Dh: a key block and a value
    block of ``B H (T/W) Dh`` numbers each per step, at every step but the last (W - 1
    sends); rank r works on ``r n^2 + n(n+1)/2`` pairs (n = T/W), all ranks on
    ``T(T+1)/2``, the last rank the most."""
    n = T // W
    per_step = 2 * B * H * n * Dh * bytes_per_number
    busiest = (W - 1) * n * n + n * (n + 1) // 2
    return per_step, (W - 1) * per_step, busiest / (T * (T + 1) / 2)


def draw_ring_config(seed: int) -> tuple[int, int, int, int, int, int]:
    """A configuration drawn from the run seed: B in {3, 5}, H in 6..16 (a count that
    leaves one out shows), W in 3..7, n = T/W in 3..64, Dh a power of two, 4 or 8 bytes
    (float32, float64; the chapter's case has bfloat16's 2); redrawn
    (`_data.draw_until`) until every known mistake gives its own number, distinct from the
    right one and from every other mistake's, so a wrong answer is never named wrongly."""

    def draw(name: int):
        gen = _data.generator(name)

        def pick(low: int, high: int) -> int:
            return int(torch.randint(low, high + 1, (1,), generator=gen))

        # B in {3, 5}, H >= 6, 4 or 8 bytes, W <= 7: leaving out B, H, the bytes or
        # the value block divides by different numbers, and W differs from 8 (bits)
        B, H, W, n = (3, 5)[pick(0, 1)], pick(6, 16), pick(3, 7), pick(3, 64)
        Dh = 2 ** pick(4, 7)
        return B, H, W * n, W, Dh, (4, 8)[pick(0, 1)]

    def distinct(config) -> bool:
        right = ring_costs_reference(*config)
        for index, mistakes in enumerate(_ring_cost_mistakes(*config)):
            values = [right[index], *(v for m, v in mistakes if m not in RING_COSTS_MAY_TIE)]
            for i, a in enumerate(values):
                if any(math.isclose(a, b, rel_tol=1e-4) for b in values[i + 1 :]):
                    return False
        return True

    return _data.draw_until(draw, distinct, seed)


def _named(value: float, right: float, mistakes) -> str | None:
    """The message of the known mistake whose number ``value`` is; None where it is none
    or the right number. Where several mistakes give this number (at W = 8, 8 times the
    bytes is both bits and the whole sequence) it names them all, "one of ...": naming
    one would be a guess."""
    found = []
    for message, wrong in mistakes:
        if math.isclose(wrong, right, rel_tol=1e-6) or not math.isclose(value, wrong, rel_tol=1e-6):
            continue
        if message not in found:
            found.append(message)
    if len(found) <= 1:
        return found[0] if found else None
    return "one of several mistakes that all give this number here: " + "; or ".join(
        message.split(": ")[0] for message in found
    )


RING_COSTS_MAY_TIE = frozenset(
    {
        "the bytes per number fixed at 2 (bfloat16): use bytes_per_number",
        "the bytes per number fixed at 4 (float32): use bytes_per_number",
        "W - 2 sends: the forward pass sends at every step but the last, W - 1 times",
    }
)
"""Mistakes whose number equals the right one or another mistake's on some
configurations by construction (2 fixed bytes are right at bfloat16 and give half the
bytes at float32, as the key block alone does; W - 2 sends are one step at W = 3): the
drawn configurations are not redrawn for them; where they tie, the message names all
the mistakes that give the number."""


def _ring_cost_mistakes(B, H, T, W, Dh, nbytes):
    step, total, fraction = ring_costs_reference(B, H, T, W, Dh, nbytes)
    n = T // W
    pairs = [(W - 1) * n * n + n * (n + 1) / 2, n * (n + 1) / 2]  # busiest, least busy
    sends = [
        ("only the key block is counted: the value block travels too, K and V", step // 2),
        ("the queries are counted as travelling too: only K and V move, Q stays", step * 3 // 2),
        ("the whole sequence's T positions: a block holds the T/W positions of one rank", step * W),
        ("bits, not bytes: multiply by the bytes per number, not 8 times that", step * 8),
        ("the bytes per number are missing: numbers times bytes_per_number", step // nbytes),
        ("the batch size B is missing: a block holds B * H * (T/W) * Dh numbers", step // B),
        ("the heads H are missing: a block holds B * H * (T/W) * Dh numbers", step // H),
        ("the bytes per number fixed at 2 (bfloat16): use bytes_per_number", step * 2 // nbytes),
        ("the bytes per number fixed at 4 (float32): use bytes_per_number", step * 4 // nbytes),
        ("a count in GiB (bytes / 2**30): return the number of bytes", step / 2**30),
    ]
    totals = [
        (
            "W sends in the forward pass: the last step sends nothing (the block would only "
            "come home), W - 1 sends",
            W * step,
        ),
        (
            "the bytes of all W ranks: the question asks what one rank sends, (W - 1) times "
            "the bytes per step",
            W * (W - 1) * step,
        ),
        ("one step only: the forward pass sends W - 1 times", step),
        (
            "W - 2 sends: the forward pass sends at every step but the last, W - 1 times",
            (W - 2) * step,
        ),
        (
            "counted twice, 2 (W - 1) sends (the forward and the backward pass?): the "
            "forward pass alone sends W - 1 times",
            2 * (W - 1) * step,
        ),
    ]
    fractions = [
        (
            "counted in blocks (W of W(W+1)/2): count unmasked query-key pairs, the last "
            "rank's (W - 1) n^2 + n(n+1)/2 of T(T+1)/2",
            2 / (W + 1),
        ),
        (
            "the diagonal blocks counted as n^2/2 pairs: a triangle with its diagonal has n(n+1)/2",
            (2 * W - 1) / W**2,
        ),
        ("1/W is a balanced ring: the contiguous causal ring is not", 1 / W),
        (
            "this is the busiest rank's work over the least busy rank's (chapter 23's "
            "printed ratio): the question asks for its share of all the ranks' work",
            pairs[0] / pairs[1],
        ),
        (
            "divided by T^2, every pair: the causal work is the T(T+1)/2 unmasked pairs",
            pairs[0] / T**2,
        ),
        (
            "divided by T^2/2: the causal work is T(T+1)/2 pairs, the diagonal included",
            pairs[0] / (T * T / 2),
        ),
        (
            "the least busy rank's share (rank 0): the busiest is the last rank",
            pairs[1] / (T * (T + 1) / 2),
        ),
        (
            "the triangles counted without their diagonal, n(n-1)/2 and T(T-1)/2: a query "
            "sees its own key, so the own block has n(n+1)/2 pairs and the whole T(T+1)/2",
            ((W - 1) * n * n + n * (n - 1) / 2) / (T * (T - 1) / 2),
        ),
        (
            "the own block's triangle counted without its diagonal, n(n-1)/2: a query sees "
            "its own key, n(n+1)/2 pairs",
            ((W - 1) * n * n + n * (n - 1) / 2) / (T * (T + 1) / 2),
        ),
        (
            "the own block counted whole, W n^2: in it only the triangle j <= i is "
            "unmasked, n(n+1)/2 pairs",
            W * n * n / (T * (T + 1) / 2),
        ),
        (
            "the busiest rank's share of its own W n^2 scores (the masked ones it saves): "
            "the question asks for its share of all the ranks' work, T(T+1)/2 pairs",
            pairs[0] / (W * n * n),
        ),
    ]
    return sends, totals, fractions


_BYTES = ((0, "bytes_per_step"), (1, "bytes_forward"))


def _real_number(raw: object, what: str) -> float:
    """``raw`` as a float: any real number counts, as the byte counts do (int, float,
    ``fractions.Fraction`` and any other ``numbers.Real``, ``decimal.Decimal``, numpy and
    torch scalars); a bool or a text does not."""
    import numbers
    from decimal import Decimal

    if isinstance(raw, Decimal):
        if not raw.is_finite():
            raise CaseFailed(f"{what} returned Decimal({raw}): expected a finite number")
        return float(raw)
    if (
        isinstance(raw, numbers.Real)
        and not isinstance(raw, bool)
        and type(raw).__module__
        not in (
            "numpy",
            "torch",
        )
    ):
        value = float(raw)
        if not math.isfinite(value):
            raise CaseFailed(f"{what} returned {show(value)}: expected a finite number")
        return value
    return _as_number(raw, what)  # numpy and torch numbers, and the wrong kinds' messages


def ring_costs_cases(candidate: Callable) -> list[Case]:
    """Cases for ``ring_costs(B, H, T, W, Dh, bytes_per_number) -> (bytes_per_step,
    bytes_forward, busiest_fraction)``: bytes compared exactly (numpy and torch numbers
    count as the numbers they hold), the fraction to a relative 1e-6 (float32's precision
    passes: the known mistakes' fractions differ from the right one by far more)."""

    def run_with(config=None, seed=None):
        def run() -> str:
            B, H, T, W, Dh, nbytes = config or draw_ring_config(seed)
            args = (B, H, T, W, Dh, nbytes)
            what = f"{answer_name(candidate)}{args}"
            raw = call_student(candidate, *args, what=what)
            if _is_vector(raw):
                raw = tuple(raw)
            got = expect_tuple(
                raw, 3, what, ("bytes_per_step", "bytes_forward", "busiest_fraction")
            )
            step, total, fraction = ring_costs_reference(*args)
            sends, totals, fractions = _ring_cost_mistakes(*args)
            numbers = [_whole_number(got[i], f"{what}'s {name}") for i, name in _BYTES]
            share = _real_number(got[2], f"{what}'s busiest_fraction")
            problems = []
            if numbers == [total, step] and total != step:
                problems.append(
                    f"bytes_per_step = {show(numbers[0])} and bytes_forward = "
                    f"{show(numbers[1])}, expected other numbers\nLikely mistake: the two "
                    "byte counts are swapped: return (bytes_per_step, bytes_forward, "
                    "busiest_fraction), one step's bytes first, then the W - 1 steps'."
                )
                numbers = [step, total]  # named: the share is still checked
            for (_, name), number, right, mistakes in zip(
                _BYTES, numbers, (step, total), (sends, totals), strict=True
            ):
                if number != right:
                    text = f"{name} = {show(number)}, expected another number"
                    # bytes_forward consistent with a wrong bytes_per_step: the mistake is
                    # the step's (naming a mistake of the total would be wrong)
                    if name == "bytes_forward" and number == (W - 1) * numbers[0] != total:
                        text += "\nHint: it is W - 1 times your bytes_per_step, the number to fix"
                    elif named := _named(number, right, mistakes):
                        text += f"\nLikely mistake: {named}."
                    problems.append(text)
            if not math.isclose(share, fraction, rel_tol=1e-6, abs_tol=0.0):
                text = f"busiest_fraction = {share:.6g}, expected another number"
                named = _named(share, fraction, fractions)
                rounded = next(
                    (places for places in range(1, 7) if share == round(fraction, places)), None
                )
                if named:
                    text += f"\nLikely mistake: {named}."
                elif rounded is not None:
                    text += (
                        f"\nHint: it is the right share rounded to {rounded} decimals: return "
                        "it unrounded (it is compared to a relative 1e-6; round only to print)."
                    )
                elif share > 1:
                    text += "\nHint: a share of the work is at most 1."
                elif share == 0:
                    text += (
                        "\nHint: a share of 0: `//` rounds the quotient down to 0; divide with `/`."
                    )
                problems.append(text)
            if problems:
                raise CaseFailed(f"{what}: " + "\n".join(problems))
            return f"{step:,} bytes a step, {total:,} forward, busiest share {fraction:.4f}"

        return run

    return [
        Case(
            "chapter 23's layer: B=1, H=32, T=2**20, W=8, Dh=128, bfloat16 (2 bytes)",
            run_with(config=RING_CHAPTER_CONFIG),
        ),
        Case("a configuration drawn from the run seed", run_with(seed=2501)),
        Case("another drawn configuration", run_with(seed=2511)),
        Case("a third drawn configuration", run_with(seed=2521)),
    ]


CASES: dict[str, Callable[[Callable], list[Case]]] = {
    "chosen_beta": chosen_beta_cases,
    "dot_product_attention": dot_product_attention_cases,
    "masked_mean_pool": masked_mean_pool_cases,
    "mistral_cache_bytes": mistral_cache_bytes_cases,
    "rope_attention": rope_attention_cases,  # chapter 14
    "moe_parameters": moe_parameters_cases,  # chapter 21
    "state_or_cache": state_or_cache_cases,  # chapter 22
    "ring_costs": ring_costs_cases,  # chapter 23
}
"""The computed questions' cases by name, as the question bank names them."""


# ``check_<name>(candidate, *, timeout=10.0) -> Report``, like the chapter checkers.
check_chosen_beta = checker("chosen_beta")(chosen_beta_cases)
check_dot_product_attention = checker("dot_product_attention")(dot_product_attention_cases)
check_masked_mean_pool = checker("masked_mean_pool")(masked_mean_pool_cases)
check_rope_attention = checker("rope_attention")(rope_attention_cases)  # chapter 14
check_moe_parameters = checker("moe_parameters")(moe_parameters_cases)  # chapter 21
check_state_or_cache = checker("state_or_cache")(state_or_cache_cases)  # chapter 22
check_ring_costs = checker("ring_costs")(ring_costs_cases)  # chapter 23
