"""Auto-checks for the exercise tasks that are not re-implementations.

Predict a shape, count parameters, pick the explanation that fits an output, find
the bug, tune ``beta``, or write a small helper the chapter does not grade elsewhere.
The student answers by *returning* the answer from a function, so that the stub
``raise NotImplementedError`` reads as "not answered yet" rather than as a wrong answer::

    def predicted_shapes():
        return (2, 3, 5), (2, 3, 6)

    report = check_quiz("02.shapes", predicted_shapes)

:func:`check_quiz` returns the same :class:`~attention_course.checks.Report` as the
checkers.

How an answer is compared:

1. It is turned into plain Python values first (:func:`plain`): numpy and torch
   scalars, 0-d arrays and tensors become ``int``/``float``/``bool``; arrays,
   tensors, lists and ``torch.Size`` become tuples. No library's ``repr`` is ever
   compared, so ``np.int64(2099712)`` counts as ``2099712``.
2. The question's :class:`Form` checks that the answer has the expected kind (one
   letter, a count, a shape, some numbers); only an answer of the wrong kind gets a
   message that names a type.
3. Letters, counts and shapes must be exact. Numbers are compared with a tolerance
   that the task statement states (:class:`Numbers`), so an estimate such as
   ``(64.01, 0.9999)`` is accepted where the statement says "within 5 %".

Fixed answers, and the known wrong answers that map to a hint, are stored encoded
(:func:`encode`, XOR with a key derived from the question id, then base64) rather than
in clear, so that reading this file does not give them away at a glance. It is
obfuscation, not secrecy: :func:`decode` reverses it. To add a question, store
``encode(question_id, answer)``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .checks import CaseResult, Report
from .checks._compare import expect_close, expect_grad, expect_tuple, fmt_shape
from .checks._runner import Case, CaseFailed, call_student, describe_exception, run_cases

# ---------------------------------------------------------------- plain values


def plain(answer: object) -> object:
    """``answer`` as plain Python values: no numpy or torch types left.

    0-d and one-element tensors or arrays, and numpy/torch scalars, become ``int``,
    ``float`` or ``bool``; other tensors, arrays, lists and ``torch.Size`` become tuples
    (nested for more than one axis). Strings and everything else are returned as they are.
    """
    if isinstance(answer, torch.Tensor):
        answer = answer.detach().cpu()
        return answer.item() if answer.numel() == 1 else plain(answer.tolist())
    if type(answer).__module__ == "numpy" and hasattr(answer, "tolist"):
        # np.generic (np.int64, np.float32, np.bool_) and np.ndarray, without importing numpy
        size = getattr(answer, "size", 1)
        return plain(answer.reshape(-1)[0].item() if size == 1 else answer.tolist())
    if isinstance(answer, (torch.Size, tuple, list)):
        return tuple(plain(v) for v in answer)
    return answer


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def show(value: object, limit: int = 80) -> str:
    """A short, stable text for an answer: ``(2, 4, 9, 7)``, ``"e"``, ``0.9999``."""
    text = _show(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _show(value: object) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value) if abs(value) < 10**60 else "a very large int"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:.6g}"
    if isinstance(value, tuple):
        inner = ", ".join(_show(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return f"a {type(value).__name__}"


def _kind(value: object) -> str:
    """What kind of value ``value`` is, in words (for wrong-kind messages)."""
    if isinstance(value, str):
        return f"the text {show(value)}"
    if isinstance(value, bool):
        return f"the bool {value}"
    if _is_number(value):
        return f"the number {show(value)}"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}, {show(value)}"
    return f"a {type(value).__name__}"


# ---------------------------------------------------------------- stored answers


def _keystream(question_id: str, size: int) -> bytes:
    stream = b""
    counter = 0
    while len(stream) < size:
        stream += hashlib.sha256(f"attention-course|{question_id}|{counter}".encode()).digest()
        counter += 1
    return stream[:size]


def encode(question_id: str, answer: object) -> str:
    """The text stored for ``answer`` to ``question_id`` (reversible by :func:`decode`)."""
    data = json.dumps(plain(answer), separators=(",", ":")).encode()
    masked = bytes(a ^ b for a, b in zip(data, _keystream(question_id, len(data))))
    return base64.urlsafe_b64encode(masked).decode().rstrip("=")


def decode(question_id: str, text: str) -> object:
    """The answer stored as ``text`` by :func:`encode`; lists come back as tuples."""
    masked = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    data = bytes(a ^ b for a, b in zip(masked, _keystream(question_id, len(masked))))
    return plain(json.loads(data))


# ---------------------------------------------------------------- forms of answers


class WrongForm(Exception):
    """The answer is not of the kind the question asks for; the message says how."""


@dataclass(frozen=True)
class Form:
    """The kind of answer a fixed question expects: read it, compare it.

    ``read`` returns the answer in a normal form or raises `WrongForm` naming what
    kind of value came back; ``same`` compares two answers in normal form;
    ``wrong`` says, without naming a type, that an answer of the right kind is wrong.
    """

    expects: str

    def read(self, value: object) -> object:
        return value

    def same(self, got: object, want: object) -> bool:
        return got == want

    def wrong(self, got: object) -> str:
        return f"{show(got)} is not the right answer"


@dataclass(frozen=True)
class Letter(Form):
    """One letter out of ``choices``; case, spaces and brackets are ignored: "(B) " is "b"."""

    choices: str = "abcd"

    def read(self, value: object) -> object:
        if not isinstance(value, str):
            raise WrongForm(f"expected {self.expects}, got {_kind(value)}")
        letter = value.strip().strip("()").strip().rstrip(".").lower()
        if letter not in self.choices or len(letter) != 1:
            options = ", ".join(f'"{c}"' for c in self.choices)
            raise WrongForm(f"{show(value.strip())} is not one of the options {options}")
        return letter

    def wrong(self, got: object) -> str:
        return f"{show(got)} is not the right option"


def _as_int(value: object) -> int | None:
    if isinstance(value, bool) or not _is_number(value):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    return int(value)


@dataclass(frozen=True)
class Count(Form):
    """A whole number; an integral float such as ``2099712.0`` counts as that int."""

    def read(self, value: object) -> object:
        count = _as_int(value)
        if count is None:
            raise WrongForm(f"expected {self.expects}, got {_kind(value)}")
        return count

    def wrong(self, got: object) -> str:
        return f"{show(got)} is not the right count"


@dataclass(frozen=True)
class Shape(Form):
    """A tuple of ints (a list or ``torch.Size`` is fine); ``length`` axes if given."""

    length: int | None = None

    def read(self, value: object) -> object:
        if not isinstance(value, tuple):
            raise WrongForm(f"expected {self.expects}, got {_kind(value)}")
        sizes = tuple(_as_int(v) for v in value)
        if any(s is None for s in sizes):
            raise WrongForm(f"expected {self.expects}, got {show(value)}: not all ints")
        if self.length is not None and len(sizes) != self.length:
            raise WrongForm(
                f"{show(value)} has {len(sizes)} axes: the question asks for a shape "
                f"of {self.length}"
            )
        return sizes

    def wrong(self, got: object) -> str:
        return f"{show(got)} is not the right shape"


@dataclass(frozen=True)
class Shapes(Form):
    """A tuple of ``count`` shapes of ``length`` ints each."""

    count: int = 2
    length: int | None = None

    def read(self, value: object) -> object:
        if not isinstance(value, tuple) or len(value) != self.count:
            raise WrongForm(f"expected {self.expects}, got {_kind(value)}")
        one = Shape(f"a tuple of {self.length} ints", self.length)
        shapes = []
        for i, item in enumerate(value):
            try:
                shapes.append(one.read(item))
            except WrongForm as error:
                raise WrongForm(f"shape {i + 1} of {self.count}: {error}") from None
        return tuple(shapes)

    def wrong(self, got: object) -> str:
        return f"{show(got)} are not the right shapes"


@dataclass(frozen=True)
class Numbers(Form):
    """A tuple of ``count`` numbers, each within ``rel_tol`` (relative) or ``abs_tol``
    (absolute) of the exact value. ``tolerance`` says so in words, as the task does."""

    count: int = 1
    rel_tol: float = 0.0
    abs_tol: float = 1e-6
    tolerance: str = "up to float rounding"

    def read(self, value: object) -> object:
        if not isinstance(value, tuple) or len(value) != self.count:
            raise WrongForm(f"expected {self.expects}, got {_kind(value)}")
        if not all(_is_number(v) for v in value):
            raise WrongForm(f"expected {self.expects}, got {show(value)}: not all numbers")
        if not all(math.isfinite(v) for v in value):
            raise WrongForm(f"{show(value)}: every number must be finite")
        return tuple(float(v) for v in value)

    def close(self, got: float, want: float) -> bool:
        # a hair of slack, so that 1.05 is "within 5 %" of 1 despite binary floats
        return abs(got - want) <= (self.rel_tol * abs(want) + self.abs_tol) * (1 + 1e-9)

    def same(self, got: object, want: object) -> bool:
        return all(self.close(g, w) for g, w in zip(got, want, strict=True))

    def wrong(self, got: object) -> str:
        return f"{show(got)} is not right (each number is accepted {self.tolerance})"


@dataclass(frozen=True)
class Question:
    """One auto-checked question.

    Fixed-answer questions give ``form`` (what kind of answer, and how it is compared),
    ``answer`` (stored with :func:`encode`) and ``hints`` (an encoded wrong answer ->
    what that answer shows); computed questions give ``cases``, a function that builds
    the checker's cases from the student's answer function, and say in ``expects`` what
    the function must be.
    """

    id: str
    expects: str = ""
    form: Form | None = None
    answer: str | None = None
    hints: dict[str, str] = field(default_factory=dict)
    cases: Callable[[Callable], list[Case]] | None = None

    def __post_init__(self) -> None:
        if self.form is not None and not self.expects:
            object.__setattr__(self, "expects", self.form.expects)


def _fixed_cases(question: Question, candidate: Callable) -> list[Case]:
    form = question.form or Form(question.expects)

    def run() -> None:
        what = f"{_name(candidate)}()"
        raw = call_student(candidate, what=what)
        if raw is None:
            raise CaseFailed(f"{what} returned None: return {question.expects}")
        try:
            verdict(raw)
        except CaseFailed:
            raise
        except Exception as error:  # noqa: BLE001 - an unreadable answer is the answer's fault
            raise CaseFailed(
                f"{what} returned a {type(raw).__name__} that cannot be read as "
                f"{question.expects} ({type(error).__name__}: {error})"
            ) from None

    def verdict(raw: object) -> None:
        answer = plain(raw)
        try:
            got, problem = form.read(answer), ""
        except WrongForm as error:
            got, problem = None, str(error)
        if got is not None and form.same(got, form.read(decode(question.id, question.answer))):
            return
        for stored, hint in question.hints.items():
            if _is_known(form, answer, got, decode(question.id, stored)):
                raise CaseFailed(f"{show(answer if got is None else got)} is not right: {hint}")
        raise CaseFailed(problem or form.wrong(got))

    return [Case("answer", run)]


def _is_known(form: Form, answer: object, got: object, known: object) -> bool:
    """Whether the answer is the known wrong answer ``known``: compared as the form
    compares when both are of the right kind (so within a tolerance for numbers), and
    as plain values when neither is (a 3-axis shape for a 4-axis question)."""
    try:
        known_read = form.read(known)
    except WrongForm:
        return got is None and answer == known
    return got is not None and form.same(got, known_read)


def _name(candidate: object) -> str:
    return getattr(candidate, "__name__", "your answer")


def _as_number(value: object, what: str) -> float:
    try:
        value = plain(value)
    except Exception as error:  # noqa: BLE001 - an unreadable answer is the answer's fault
        raise CaseFailed(
            f"{what} returned a {type(value).__name__} that is not a number "
            f"({type(error).__name__}: {error})"
        ) from None
    if not _is_number(value):
        raise CaseFailed(f"{what} returned {_kind(value)}: expected a number")
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


# ---------------------------------------------------------------- computed questions


def _inputs(*shapes: tuple[int, ...], seed: int, dtype: torch.dtype) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype) for shape in shapes]


def _backward(got: torch.Tensor, expected: torch.Tensor, name: str, seed: int) -> None:
    """Backpropagate the same random upstream gradient through the student's and the
    reference's ``name``; fail, naming the likely cause, when no graph is attached."""
    gen = torch.Generator().manual_seed(seed)
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


def _dot_product_attention_cases(candidate: Callable) -> list[Case]:
    from .attention import scaled_dot_product_attention

    def run_with(
        shapes: tuple[tuple[int, ...], ...], seed: int, dtype=torch.float64, grad: bool = False
    ) -> Callable[[], None]:
        def run() -> None:
            q, k, v = _inputs(*shapes, seed=seed, dtype=dtype)
            mine = [t.clone().requires_grad_(grad) for t in (q, k, v)]
            theirs = [t.clone().requires_grad_(grad) for t in (q, k, v)]
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
                _backward(output, want_out, "output", seed + 1)
                for name, a, b in zip(("`query`", "`key`", "`value`"), mine, theirs):
                    expect_grad(a.grad, b.grad, name)

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


def _masked_mean_pool_cases(candidate: Callable) -> list[Case]:
    from .classifier import masked_mean_pool
    from .masking import padding_mask

    def run_with(
        lengths: list[int], T: int, seed: int, dtype=torch.float64, grad: bool = False
    ) -> Callable[[], str]:
        def run() -> str:
            (x,) = _inputs((len(lengths), T, 4), seed=seed, dtype=dtype)
            mask = padding_mask(torch.tensor(lengths), max_len=T)  # (B, T), True at real tokens
            mine, theirs = x.clone().requires_grad_(grad), x.clone().requires_grad_(grad)
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
                _backward(got, want, "pooled output", seed + 1)
                expect_grad(mine.grad, theirs.grad, "`x`")
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
        form=Shapes("a pair of shapes: (weights shape, output shape)", count=2, length=3),
        answer="Kkbpem9EUeSvDkFjPO34pf8",
        hints={
            "KkbpemlEV-SvDkFjPO34pf8": (
                "the weights have one row per query (T = 3) and one column per key (S = 5)"
            ),
            "Kkbpem9EUeSvDkFjPO36pf8": (
                "the output averages the values, so its last axis is Dv = 6, not Dk = 4"
            ),
            "Kkbpem9EUeSvDkFjOu34pf8": "the output has one row per query (T = 3), not per key",
            "Kkbpem9EUuSvDkFjPO37pf8": (
                "the two shapes are in the wrong order: the weights' shape first, then the output's"
            ),
        },
    )
)
_add(
    Question(
        "02.projections",
        form=Letter('one letter, "a" to "d"'),
        answer="6wRL",
        hints={
            "6wdL": (
                "a larger beta sharpens the same ranking: each token's top score is still itself"
            ),
            "6wVL": ("dividing every score by the same positive number keeps their ranking"),
            "6wJL": "the values change what is averaged, not where the weights go",
        },
    )
)
_add(
    Question(
        "03.hidden_shape",
        form=Shape("a shape (a tuple of four ints)", length=4),
        answer="7BQpgUdnXmmS",
        hints={
            "7BQph0dhXmmS": "queries index the rows (T = 3) and keys the columns (S = 5)",
            "7BQpgUdnLw": (
                "that is the shape of the scores after `v`; the question asks for the "
                "tanh features before `v`"
            ),
            "7BQpgUdqLw": (
                "the features are computed for every query-key pair, not once per query"
            ),
            "7BQpgUdnXmWS": "W and U map to the hidden width 8 before they are added",
            "7BQpgUdnXmCS": (
                "that is the shape of the scores after `v`, before the squeeze; the question "
                "asks for the tanh features before `v`, whose last axis is the hidden width"
            ),
        },
    )
)
_add(
    Question(
        "04.which_bug",
        form=Letter('one letter, "a" to "d"'),
        answer="icXu",
        hints={
            "icbu": ("dividing by sqrt(d_k) is right: print the weights' row sums instead"),
            "icTu": "`weights @ value` is right once the weights are right",
            "icPu": "print `weights.sum(-1)`: each query's weights should sum to 1",
        },
    )
)
_add(
    Question(
        "04.variances",
        form=Numbers(
            "a pair of numbers (variance before, variance after scaling)",
            count=2,
            rel_tol=0.05,
            abs_tol=0.0,
            tolerance="within 5 % of the exact value",
        ),
        answer="efyzSRfW",
        hints={
            "efKrVHs": ("8 is the standard deviation of q . k; its variance is d_k = 64"),
            "efyzSR7W": "dividing by sqrt(64) = 8 divides the variance by 64, not by 8",
            "efurVHs": (
                "before scaling, the variance of a sum of d_k unit-variance products is d_k"
            ),
            "efKrVQi6ZkoG": "dividing by sqrt(d_k) divides the variance by d_k",
        },
    )
)
_add(
    Question(
        "05.combined_mask_shape",
        form=Shape("a shape (a tuple of ints)"),
        answer="xTSqzYzJITvI",
        hints={
            "xTSqzYzNITvI": "`&` broadcasts: the causal mask (5, 5) fills the query axis",
            "xTSqyYzJUA": "the two `None` axes stay in the result: count the axes",
            "xTSqyf0": "the causal mask adds a query axis: one row per query",
            "xTKqyf0": "the padding mask keeps its batch axis of 3",
        },
    )
)
_add(
    Question(
        "06.parameter_count",
        form=Count("an int"),
        answer="cLMJWWA",
        hints={
            "cLMMVWQ": "each of the four projections also has a bias of 64 numbers",
            "cLYMXGJ1": (
                "the heads share the four D x D projections: splitting into heads adds "
                "no parameters"
            ),
            "c7UHXQ": (
                "each head is 8 wide, but every projection still maps all 64 features to 64"
            ),
            "cLcLVWA": ("there are four projections: w_q, w_k, w_v and the output projection w_o"),
        },
    )
)
_add(
    Question(
        "07.layer_norm_axes",
        form=Letter('one letter, "a" to "d"'),
        answer="Qoua",
        hints={
            "Qoia": (
                "one mean per feature over all tokens in the batch is what BatchNorm computes"
            ),
            "Qoma": ("that would be LayerNorm((T, D)); LayerNorm(D) normalises the last axis only"),
            "Qo6a": "LayerNorm never mixes statistics across the batch",
        },
    )
)
_add(
    Question(
        "08.parameter_count",
        form=Count("an int"),
        answer="iEaA4EtDMg",
        hints={
            "iEaA7k1HMg": "linear1 and linear2 each have a bias (2048 and 512 numbers)",
            "i0aM6U1DMg": "there are two linear layers, 512 -> 2048 and 2048 -> 512",
            "i0aN4ExKOA": (
                "there are two linear layers, 512 -> 2048 and 2048 -> 512, each with a bias"
            ),
        },
    )
)
_add(
    Question(
        "08.swap_positions",
        form=Letter('one letter, "a" to "d"'),
        answer="2097",
        hints={
            "20x7": (
                "the network is applied to each position on its own: other rows cannot see the swap"
            ),
            "2017": "the output rows follow their input rows: two of them move",
            "20p7": (
                "each row's output depends only on that row's input, which did not "
                "change; it only moved"
            ),
        },
    )
)
_add(
    Question(
        "09.position_zero",
        form=Numbers("a tuple of six numbers", count=6),
        answer="yTXWjH6qAxUgnKD3aA",
        hints={
            "yTTWjX6rAxQgnaD2aA": (
                "sin goes to the even features and sin(0) = 0; cos(0) = 1 goes to the odd ones"
            ),
            "yTXWjX6qAxQgnKD2aA": "the odd features hold cos(0) = 1",
            "yTTWjH6rAxUgnaD3aA": "the even features hold sin(0) = 0",
        },
    )
)
_add(
    Question(
        "09.reverse_order",
        form=Letter('one letter, "a" to "d"'),
        answer="k8I4",
        hints={
            "k8E4": ("each output row still belongs to its own token, and the tokens moved"),
            "k8A4": (
                "without positions, attention sees a set: the same tokens give the same"
                " outputs, reordered"
            ),
            "k8c4": ("without positions, nothing in the layer knows which token came first"),
        },
    )
)
_add(
    Question(
        "10.cross_attention_shape",
        form=Shape("a shape (a tuple of four ints)", length=4),
        answer="myfGm4Pt87Ac",
        hints={
            "myfGm4Pj874c": ("queries come from the decoder (7 of them), keys from the memory (9)"),
            "myfGm4Pt874c": "that is the shape of the decoder's self-attention weights",
            "myfGmIPjgg": "there is one set of weights per head: (B, H, T, S)",
            "myfGm4Pj87Ac": ("the queries come from the decoder stream, not from the encoder"),
        },
    )
)
_add(
    Question(
        "11.padding_bug",
        form=Letter('one letter, "a" to "d"'),
        answer="9OLg",
        hints={
            "9OHg": (
                "the mask stops tokens from attending to padding, but the padding "
                "positions still get outputs, and `.mean(dim=1)` averages them in"
            ),
            "9ODg": "it trains; the gradients are just polluted by the padding",
            "9Ofg": (
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
