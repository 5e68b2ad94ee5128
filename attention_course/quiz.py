"""Auto-checks for the exercise tasks that are not re-implementations.

Predict a shape, count parameters, pick the explanation that fits an output, find
the bug, tune ``beta``, or write a small helper the chapter does not grade elsewhere.
The student answers by *returning* the answer from a function, so that the stub
``raise NotImplementedError`` reads as "not answered yet" rather than as a wrong answer::

    def predicted_shapes():
        return (2, 3, 5), (2, 3, 6)

    report = check_quiz("02.shapes", predicted_shapes)

:func:`check_quiz` returns the same :class:`~attention_course.checks.Report` as the
checkers. Fixed answers are stored as salted SHA-256 digests, not in clear, so reading
this file does not give them away; known wrong answers map to a hint the same way.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .checks import CaseResult, Report
from .checks._runner import Case, CaseFailed, call_student, run_cases


def canonical(answer: object) -> str:
    """A normal form of an answer: shapes and lists become tuples of ints, text is
    lower-cased and stripped, integral floats become ints."""

    def norm(value: object) -> object:
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, (torch.Size, tuple, list)):
            return tuple(norm(v) for v in value)
        if isinstance(value, bool):
            return value
        if isinstance(value, float) and math.isfinite(value) and value == int(value):
            return int(value)
        if isinstance(value, str):
            return value.strip().strip("()").strip().lower()
        return value

    return repr(norm(answer))


def digest(question_id: str, answer: object) -> str:
    """The salted digest stored for an answer to ``question_id``."""
    text = f"attention-course|{question_id}|{canonical(answer)}"
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Question:
    """One auto-checked question.

    ``expects`` says in words what the answer function must return. Fixed-answer
    questions give ``answer`` (a digest) and ``hints`` (digest of a wrong answer -> what
    that answer shows); computed questions give ``cases``, a function that builds the
    checker's cases from the student's answer function.
    """

    id: str
    expects: str
    answer: str | None = None
    hints: dict[str, str] = field(default_factory=dict)
    cases: Callable[[Callable], list[Case]] | None = None


def _fixed_cases(question: Question, candidate: Callable) -> list[Case]:
    def run() -> None:
        answer = call_student(candidate, what=f"{_name(candidate)}()")
        if answer is None:
            raise CaseFailed(f"{_name(candidate)}() returned None: return {question.expects}")
        key = digest(question.id, answer)
        if key == question.answer:
            return
        hint = question.hints.get(key)
        message = f"{canonical(answer)} is not right"
        raise CaseFailed(message + (f": {hint}" if hint else f" (expected {question.expects})"))

    return [Case("answer", run)]


def _name(candidate: object) -> str:
    return getattr(candidate, "__name__", "your answer")


def _as_number(value: object, what: str) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CaseFailed(f"{what} returned {value!r}: expected a number")
    if not math.isfinite(value):
        raise CaseFailed(f"{what} returned {value!r}: expected a finite number")
    return float(value)


# ---------------------------------------------------------------- chapter 1: tune beta

# Three tokens on the unit circle: token 1 is a near-twin of token 0.
BETA_TOKENS = ((1.0, 0.0), (0.8, 0.6), (0.0, 1.0))


def _beta_cases(candidate: Callable) -> list[Case]:
    from .attention import set_attention

    X = torch.tensor(BETA_TOKENS, dtype=torch.float64)
    found: dict[str, torch.Tensor] = {}

    def weights() -> torch.Tensor:
        if "A" not in found:
            what = f"{_name(candidate)}()"
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
                f"{diagonal[worst].item():.3f} of its weight for itself (needs >= 0.7): "
                "a larger beta sharpens the weights"
            )
        return f"self-weights {[round(v, 3) for v in diagonal.tolist()]}"

    def twin_weight() -> str:
        A = weights()
        if A[0, 1].item() < 0.1:
            raise CaseFailed(
                f"with beta={found['beta']:g} token 0 gives only {A[0, 1].item():.3f} to its "
                "near-twin token 1 (needs >= 0.1): beta is so large that attention is almost "
                "hard; make it smaller"
            )
        return f"token 0 -> token 1: {A[0, 1].item():.3f}"

    return [
        Case("every token keeps >= 70% for itself", self_weight),
        Case("token 0 still gives >= 10% to token 1", twin_weight),
    ]


# ---------------------------------------------------------------- chapter 2: Q, K, V


def _dot_product_attention_cases(candidate: Callable) -> list[Case]:
    from .attention import scaled_dot_product_attention

    def compare(shape_q, shape_k, shape_v, what: str) -> Callable[[], None]:
        def run() -> None:
            gen = torch.Generator().manual_seed(len(what))
            q = torch.randn(*shape_q, generator=gen, dtype=torch.float64)
            k = torch.randn(*shape_k, generator=gen, dtype=torch.float64)
            v = torch.randn(*shape_v, generator=gen, dtype=torch.float64)
            shapes = f"query {tuple(q.shape)}, key {tuple(k.shape)}, value {tuple(v.shape)}"
            call = f"dot_product_attention({shapes})"
            result = call_student(
                candidate, q, k, v, what=call, arg_names=("query", "key", "value")
            )
            if not isinstance(result, tuple) or len(result) != 2:
                raise CaseFailed(f"{call} should return a pair (output, weights)")
            output, weights = result
            want_out, want_w = scaled_dot_product_attention(q, k, v, scale=1.0)
            for name, got, want in (("weights", weights, want_w), ("output", output, want_out)):
                if not isinstance(got, torch.Tensor):
                    raise CaseFailed(f"{name} is a {type(got).__name__}, expected a tensor")
                if got.shape != want.shape:
                    raise CaseFailed(
                        f"{name} has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
                    )
            if not torch.allclose(weights, want_w, atol=1e-6):
                scaled = scaled_dot_product_attention(q, k, v)[1]
                if torch.allclose(weights, scaled, atol=1e-6):
                    raise CaseFailed(
                        "your weights are scaled by 1/sqrt(d_k): that is chapter 4's "
                        "attention; here the scores are the plain dot products q . k"
                    )
                if torch.allclose(weights.sum(-2), torch.ones_like(weights.sum(-2))):
                    raise CaseFailed(
                        "your weights sum to 1 over the queries, not over the keys: "
                        "take the softmax over the last axis"
                    )
                raise CaseFailed("weights differ from softmax(query @ key^T) over the keys")
            if not torch.allclose(output, want_out, atol=1e-6):
                raise CaseFailed("output differs from weights @ value")

        return run

    return [
        Case("one query set, T == S", compare((4, 3), (4, 3), (4, 3), "square")),
        Case("batched, T != S, Dk != Dv", compare((2, 3, 4), (2, 5, 4), (2, 5, 6), "batched")),
        Case("two batch axes", compare((2, 2, 1, 4), (2, 2, 5, 4), (2, 2, 5, 3), "two axes")),
    ]


# ---------------------------------------------------------------- chapter 11: pooling


def _masked_mean_pool_cases(candidate: Callable) -> list[Case]:
    def reference(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = mask.to(x.dtype).unsqueeze(-1)  # (B, T) -> (B, T, 1)
        return (x * weights).sum(1) / weights.sum(1).clamp(min=1.0)

    def run_with(lengths: list[int], T: int, seed: int) -> Callable[[], str]:
        def run() -> str:
            gen = torch.Generator().manual_seed(seed)
            x = torch.randn(len(lengths), T, 4, generator=gen, dtype=torch.float64)
            mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
            call = f"masked_mean_pool(x {tuple(x.shape)}, mask {tuple(mask.shape)})"
            got = call_student(candidate, x, mask, what=call, arg_names=("x", "mask"))
            want = reference(x, mask)
            if not isinstance(got, torch.Tensor) or got.shape != want.shape:
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                raise CaseFailed(f"{call} returned {shape}, expected shape {tuple(want.shape)}")
            if bool(torch.isnan(got).any()):
                raise CaseFailed(
                    "NaN in the output: a sequence with no real token divides 0 by 0; "
                    "clamp the count to at least 1"
                )
            if not torch.allclose(got, want, atol=1e-6):
                if torch.allclose(got, x.mean(1), atol=1e-6):
                    raise CaseFailed(
                        "you averaged over every position, padding included: multiply by "
                        "the mask and divide by the number of real tokens"
                    )
                if torch.allclose(got, (x * mask[..., None]).sum(1) / T, atol=1e-6):
                    raise CaseFailed(
                        "you zeroed the padding but divided by T: divide by the number of "
                        "real tokens in each sequence"
                    )
                raise CaseFailed("the pooled vectors differ from the mean over real tokens")
            return ""

        return run

    return [
        Case("no padding", run_with([5, 5], 5, 1)),
        Case("different lengths", run_with([5, 2, 3], 5, 2)),
        Case("a sequence with no real token gives zeros", run_with([3, 0], 4, 3)),
    ]


# ---------------------------------------------------------------- the question bank

QUESTIONS: dict[str, Question] = {}


def _add(question: Question) -> None:
    QUESTIONS[question.id] = question


_add(Question("01.beta", "a positive number beta", cases=_beta_cases))
_add(
    Question(
        "02.dot_product_attention",
        "a function (query, key, value) -> (output, weights)",
        cases=_dot_product_attention_cases,
    )
)
_add(
    Question(
        "02.shapes",
        "a pair of shapes: (weights shape, output shape)",
        answer="b4620811866d7955bda9",
        hints={
            "0fc638ce7d51f5dbdf1a": (
                "the weights have one row per query (T = 3) and one column per key (S = 5)"
            ),
            "622d6e27afa0746a0852": (
                "the output averages the values, so its last axis is Dv = 6, not Dk = 4"
            ),
            "5748af09e4a56af2df32": "the output has one row per query (T = 3), not per key",
        },
    )
)
_add(
    Question(
        "02.projections",
        'one letter, "a" to "d"',
        answer="a0189bd3fe8fb016f850",
        hints={
            "e2bf767b05a84c35b0b5": (
                "a larger beta sharpens the same ranking: each token's top score is still itself"
            ),
            "3913813a7ef56ed08718": (
                "dividing every score by the same positive number keeps their ranking"
            ),
            "1d7dafd1de1fcf688065": "the values change what is averaged, not where the weights go",
        },
    )
)
_add(
    Question(
        "03.hidden_shape",
        "a shape (a tuple of four ints)",
        answer="db0a8cd198bddd34d37e",
        hints={
            "24678da561606cf47674": "queries index the rows (T = 3) and keys the columns (S = 5)",
            "7b55e04ee50d6e009e00": (
                "that is the shape of the scores after `v`; the question asks for the "
                "tanh features before `v`"
            ),
            "07f179091206a312bcf8": (
                "the features are computed for every query-key pair, not once per query"
            ),
            "bd98b7b3cb070f162b05": "W and U map to the hidden width 8 before they are added",
        },
    )
)
_add(
    Question(
        "04.which_bug",
        'one letter, "a" to "d"',
        answer="470cc1156588e2de671c",
        hints={
            "b5105bebc79db4f627f1": (
                "dividing by sqrt(d_k) is right: print the weights' row sums instead"
            ),
            "88987d89d04066936dec": "`weights @ value` is right once the weights are right",
            "0731c5b7894f1faf74e1": "print `weights.sum(-1)`: each query's weights should sum to 1",
        },
    )
)
_add(
    Question(
        "04.variances",
        "a pair of numbers (variance before, variance after scaling)",
        answer="d4b862b91e00c6ee1ee6",
        hints={
            "183477aac1725d5f640a": (
                "8 is the standard deviation of q . k; its variance is d_k = 64"
            ),
            "cab609f72a3eb2d322a1": "dividing by sqrt(64) = 8 divides the variance by 64, not by 8",
            "38acb6b1e7fe40fb38a9": (
                "before scaling, the variance of a sum of d_k unit-variance products is d_k"
            ),
            "0b4317bd7f3077ac03eb": "dividing by sqrt(d_k) divides the variance by d_k",
        },
    )
)
_add(
    Question(
        "05.combined_mask_shape",
        "a shape (a tuple of ints)",
        answer="9f44504201a5576ced7f",
        hints={
            "387b7f7c692f5ef0217c": "`&` broadcasts: the causal mask (5, 5) fills the query axis",
            "6d4dad93acd6afe7dca6": "the two `None` axes stay in the result: count the axes",
            "0670129a3abcb3922bf1": "the causal mask adds a query axis: one row per query",
            "86ecf74e12a860d6bbc0": "the padding mask keeps its batch axis of 3",
        },
    )
)
_add(
    Question(
        "06.parameter_count",
        "an int",
        answer="9a5b16221c3593cb2603",
        hints={
            "7e8af3614d116f6281de": "each of the four projections also has a bias of 64 numbers",
            "b14fe3e36ef7eb7b0c90": (
                "the heads share the four D x D projections: splitting into heads adds "
                "no parameters"
            ),
            "55bf5015c74906083dec": (
                "each head is 8 wide, but every projection still maps all 64 features to 64"
            ),
            "49f81bf676dbc224df63": (
                "there are four projections: w_q, w_k, w_v and the output projection w_o"
            ),
        },
    )
)
_add(
    Question(
        "07.layer_norm_axes",
        'one letter, "a" to "d"',
        answer="6270f4a89ee912af8d92",
        hints={
            "a27a6859731048782f9e": (
                "one mean per feature over all tokens in the batch is what BatchNorm computes"
            ),
            "99a4ecc2caf3b4c3da55": (
                "that would be LayerNorm((T, D)); LayerNorm(D) normalises the last axis only"
            ),
            "3602bb8a4ff62ab7ae9e": "LayerNorm never mixes statistics across the batch",
        },
    )
)
_add(
    Question(
        "08.parameter_count",
        "an int",
        answer="94178ee0ba20cc2817ca",
        hints={
            "8c1286ff8881a562c3a9": "linear1 and linear2 each have a bias (2048 and 512 numbers)",
            "aa188adebc57dca2b943": "there are two linear layers, 512 -> 2048 and 2048 -> 512",
            "03a69f41b1db393fb308": (
                "there are two linear layers, 512 -> 2048 and 2048 -> 512, each with a bias"
            ),
        },
    )
)
_add(
    Question(
        "08.swap_positions",
        'one letter, "a" to "d"',
        answer="5d1ec352aa4f1df70fc8",
        hints={
            "98178692364c3569ece3": (
                "the network is applied to each position on its own: other rows cannot see the swap"
            ),
            "1a172034edbde74a0768": "the output rows follow their input rows: two of them move",
            "fec850d37bf267b5a647": (
                "each row's output depends only on that row's input, which did not "
                "change; it only moved"
            ),
        },
    )
)
_add(
    Question(
        "09.position_zero",
        "a tuple of six numbers",
        answer="2e3aa23a0197e19eb82b",
        hints={
            "6affd2301529fecc1d28": (
                "sin goes to the even features and sin(0) = 0; cos(0) = 1 goes to the odd ones"
            ),
            "2d6e36b6143ce2bd3f22": "the odd features hold cos(0) = 1",
            "5883009f9360ed380b00": "the even features hold sin(0) = 0",
        },
    )
)
_add(
    Question(
        "09.reverse_order",
        'one letter, "a" to "d"',
        answer="e1cd51dcc7f5c057f9c0",
        hints={
            "89f407985dbb0d833b25": (
                "each output row still belongs to its own token, and the tokens moved"
            ),
            "62ded46399032957343d": (
                "without positions, attention sees a set: the same tokens give the same"
                " outputs, reordered"
            ),
            "1615efe1f88db457058e": (
                "without positions, nothing in the layer knows which token came first"
            ),
        },
    )
)
_add(
    Question(
        "10.cross_attention_shape",
        "a shape (a tuple of four ints)",
        answer="bf223605910ffd06919e",
        hints={
            "e723045530e62823463c": (
                "queries come from the decoder (7 of them), keys from the memory (9)"
            ),
            "c3f44f7b3935887eea4d": "that is the shape of the decoder's self-attention weights",
            "448ca65bc09333063719": "there is one set of weights per head: (B, H, T, S)",
            "931527e5ce3ea6c46e7d": (
                "the queries come from the decoder stream, not from the encoder"
            ),
        },
    )
)
_add(
    Question(
        "11.padding_bug",
        'one letter, "a" to "d"',
        answer="c210d54911afbdd0a449",
        hints={
            "c01bacab9622511c839e": (
                "the mask stops tokens from attending to padding, but the padding "
                "positions still get outputs, and `.mean(dim=1)` averages them in"
            ),
            "c265996fb4c05d59769e": "it trains; the gradients are just polluted by the padding",
            "b0657ea681e15c8c505e": (
                "the longest sentence has no padding, so its mean is the only one that is right"
            ),
        },
    )
)
_add(
    Question(
        "11.masked_mean_pool",
        "a function (x, mask) -> pooled",
        cases=_masked_mean_pool_cases,
    )
)


def check_quiz(question_id: str, answer: Callable, *, timeout: float = 10.0) -> Report:
    """Check the student's answer function for ``question_id``; return a Report.

    ``answer`` is the function whose return value is the answer (or, for a
    computed question, the function under test). It never raises because of the
    answer: a ``NotImplementedError`` gives the "not implemented yet" report.
    """
    question = QUESTIONS.get(question_id)
    target = f"quiz_{question_id.replace('.', '_')}"
    if question is None:
        known = ", ".join(sorted(QUESTIONS))
        return Report(
            f"check_{target}",
            [CaseResult("question", False, f"no question {question_id!r}; known: {known}")],
        )
    if not callable(answer):
        return Report(
            f"check_{target}",
            [
                CaseResult(
                    "answer",
                    False,
                    f"expected a function that returns {question.expects}, got "
                    f"{type(answer).__name__}",
                )
            ],
        )
    cases = question.cases(answer) if question.cases else _fixed_cases(question, answer)
    return run_cases(target, cases, timeout)
