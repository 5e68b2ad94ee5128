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
obfuscation, not secrecy: :func:`decode` reverses it.

The questions are data, ``quiz_bank.json`` beside this module: a fixed question names its
:class:`Form` and stores ``encode(question_id, answer)`` and its hints; a computed question
names its cases in :mod:`attention_course.checks.quiz_computed`, whose checkers diagnose the
mistakes a student's function makes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources

from .checks import CaseResult, Report
from .checks._answers import answer_name, is_number, kind, plain, show
from .checks._data import drawing_from
from .checks._runner import Case, CaseFailed, call_student, run_cases
from .checks.quiz_computed import CASES

__all__ = [
    "QUESTIONS",
    "Count",
    "Form",
    "Letter",
    "Numbers",
    "Question",
    "Shape",
    "Shapes",
    "check_quiz",
    "decode",
    "encode",
    "plain",
    "show",
]


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
        return f"{self.show(got)} is not the right answer"

    def show(self, got: object) -> str:
        """``got`` (in normal form) as messages print it."""
        return show(got)


@dataclass(frozen=True)
class Letter(Form):
    """One letter out of ``choices``; case, spaces and brackets are ignored: "(B) " is "b"."""

    choices: str = "abcd"

    def read(self, value: object) -> object:
        if not isinstance(value, str):
            raise WrongForm(f"expected {self.expects}, got {kind(value)}")
        letter = value.strip().strip("()").strip().rstrip(".").lower()
        if letter not in self.choices or len(letter) != 1:
            options = ", ".join(f'"{c}"' for c in self.choices)
            raise WrongForm(f"{show(value.strip())} is not one of the options {options}")
        return letter

    def wrong(self, got: object) -> str:
        return f"{show(got)} is not the right option"


def _as_int(value: object) -> int | None:
    if isinstance(value, bool) or not is_number(value):
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
            raise WrongForm(f"expected {self.expects}, got {kind(value)}")
        return count

    def wrong(self, got: object) -> str:
        return f"{show(got)} is not the right count"


@dataclass(frozen=True)
class Shape(Form):
    """A tuple of ints (a list or ``torch.Size`` is fine); ``length`` axes if given."""

    length: int | None = None

    def read(self, value: object) -> object:
        if not isinstance(value, tuple):
            raise WrongForm(f"expected {self.expects}, got {kind(value)}")
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
            raise WrongForm(f"expected {self.expects}, got {kind(value)}")
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
    (absolute) of the exact value. ``tolerance`` says so in words, as the task does.

    ``relative_to`` (one point per number) makes the relative tolerance one of the
    distance from that point: a weight of 0.99968 compared as 1 - 0.99968 = 0.00032, so
    that 1 itself, the uncapped answer, is not "within 0.1 %" of it. ``limits``, an open
    interval every number must lie in, with ``limits_why`` saying why."""

    count: int = 1
    rel_tol: float = 0.0
    abs_tol: float = 1e-6
    tolerance: str = "up to float rounding"
    relative_to: tuple[float, ...] | None = None
    limits: tuple[float, float] | None = None
    limits_why: str = ""

    def read(self, value: object) -> object:
        if self.count == 1 and is_number(value):  # one number may come bare: 4.6 is (4.6,)
            value = (value,)
        if not isinstance(value, tuple) or len(value) != self.count:
            raise WrongForm(f"expected {self.expects}, got {kind(value)}")
        if not all(is_number(v) for v in value):
            raise WrongForm(f"expected {self.expects}, got {show(value)}: not all numbers")
        if not all(math.isfinite(v) for v in value):
            raise WrongForm(f"{show(value)}: every number must be finite")
        return tuple(float(v) for v in value)

    def close(self, got: float, want: float, origin: float = 0.0) -> bool:
        # a hair of slack, so that 1.05 is "within 5 %" of 1 despite binary floats
        scale = abs(want - origin)
        return abs(got - want) <= (self.rel_tol * scale + self.abs_tol) * (1 + 1e-9)

    def same(self, got: object, want: object) -> bool:
        origins = self.relative_to or (0.0,) * len(want)
        return all(self.close(g, w, o) for g, w, o in zip(got, want, origins, strict=True))

    def show(self, got: object) -> str:
        # one number is printed as a number: 6.6865, not (6.6865,)
        if self.count == 1 and isinstance(got, tuple) and len(got) == 1:
            return show(got[0])
        return show(got)

    def wrong(self, got: object) -> str:
        if self.limits is not None:
            low, high = self.limits
            outside = [v for v in got if not low < v < high]
            if outside:
                return (
                    f"{self.show(got)} is not right: {show(outside[0])} is not strictly "
                    f"between {show(low)} and {show(high)}: {self.limits_why}"
                )
        each = "it is" if self.count == 1 else "each number is"
        return f"{self.show(got)} is not right ({each} accepted {self.tolerance})"


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
        what = f"{answer_name(candidate)}()"
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
            got, problem = None, _name_lists(str(error), raw, answer)
        if got is not None and form.same(got, form.read(decode(question.id, question.answer))):
            return
        for stored, hint in question.hints.items():
            if _is_known(form, answer, got, decode(question.id, stored)):
                shown = show(answer) if got is None else form.show(got)
                raise CaseFailed(f"{shown} is not right: {hint}")
        raise CaseFailed(problem or form.wrong(got))

    return [Case("answer", run)]


def _name_lists(problem: str, raw: object, answer: object) -> str:
    """``problem`` with a list the student returned called a list: :func:`plain` turns
    it into a tuple, which the wrong-kind message would otherwise name."""
    if not isinstance(raw, list) or not isinstance(answer, tuple):
        return problem
    text = show(answer)
    if text.startswith("(") and text.endswith(")"):
        text = "[" + text[1:-1].removesuffix(",") + "]"
    return problem.replace(kind(answer), f"a list of {len(raw)}, {text}")


def _is_known(form: Form, answer: object, got: object, known: object) -> bool:
    """Whether the answer is the known wrong answer ``known``: compared as the form
    compares when both are of the right kind (so within a tolerance for numbers), and
    as plain values when neither is (a 3-axis shape for a 4-axis question)."""
    try:
        known_read = form.read(known)
    except WrongForm:
        return got is None and answer == known
    return got is not None and form.same(got, known_read)


# ---------------------------------------------------------------- the question bank

FORMS: dict[str, type[Form]] = {
    "letter": Letter,
    "count": Count,
    "shape": Shape,
    "shapes": Shapes,
    "numbers": Numbers,
}


def _question(record: dict) -> Question:
    """A :class:`Question` from one record of ``quiz_bank.json``."""
    if "computed" in record:
        return Question(record["id"], record["expects"], cases=CASES[record["computed"]])
    form = dict(record["form"])
    for key in ("relative_to", "limits"):  # JSON lists, frozen as tuples
        if key in form:
            form[key] = tuple(form[key])
    return Question(
        record["id"],
        form=FORMS[form.pop("kind")](**form),
        answer=record["answer"],
        hints=record["hints"],
    )


def load_questions() -> dict[str, Question]:
    """The question bank, ``attention_course/quiz_bank.json``, by question id."""
    text = resources.files(__package__).joinpath("quiz_bank.json").read_text(encoding="utf-8")
    return {r["id"]: _question(r) for r in json.loads(text)["questions"]}


QUESTIONS: dict[str, Question] = load_questions()


def check_quiz(
    question_id: str, answer: Callable, *, timeout: float = 10.0, seed: int = 0
) -> Report:
    """Check the student's answer function for ``question_id``; return a Report.

    ``answer`` is the function whose return value is the answer (or, for a
    computed question, the function under test). It never raises because of the
    answer: a ``NotImplementedError`` gives the "not implemented yet" report.
    ``seed`` is the run seed the inputs of a computed question are drawn from, as for
    every checker (0: the check cell's inputs; the grader draws a fresh one per run).
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
    with drawing_from(seed):
        cases = question.cases(answer) if question.cases else _fixed_cases(question, answer)
        return run_cases(target, cases, timeout)
