"""Run a checker's cases safely: student code can raise, hang or misbehave.

Each case is a small function that returns normally when the case passes and
raises `CaseFailed` with a message for the student when it does not. The
runner executes every case in a worker thread with a time limit, turns any
exception into a failed case, and stops early with a single friendly case
when the candidate still raises `NotImplementedError`.

Partial credit (the scheme `Report.score` applies): a case counts with its ``weight``
(1 ordinary, `TRIVIAL` for a size-1 or round-trip case). A *support* case
(``Case(..., support=True)``) is one that a degenerate answer passes: a constant, the
input returned unchanged, the right answer transposed, an off-by-one mask, or an answer
whose values are never looked at (a size-1 input whose transpose is itself, a device
given explicitly or the meta device, an argument that must raise ValueError, attribute
names, causality alone). A support case runs and reports as any other, and it counts
with its weight only when the candidate also passes at least one case that is not a
support case; otherwise it counts 0, and so does the score. A solution right in the main
cases and wrong in one extra feature (dropout, ``norm_first=True``, a mask argument, the
device) keeps the weight of what it gets right; an answer that does no real work scores
exactly 0. ``tests/test_partial_credit.py`` runs such answers (``tests/degenerate.py``)
against every checker.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import dataclasses
import inspect
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ._data import case_seed, drawing_from
from ._mistakes import mistake_in
from ._policy import policy_problem
from ._report import CaseResult, Report

NOT_IMPLEMENTED_MESSAGE = "not implemented yet: replace `raise NotImplementedError` with your code"

_CHECKS_DIR = os.path.dirname(os.path.abspath(__file__))
_PACKAGE_DIR = os.path.dirname(_CHECKS_DIR)  # attention_course/: the references, the checkers
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_THREADING_FILE = os.path.abspath(threading.__file__)


class CaseFailed(Exception):
    """Raised inside a case: the case failed, and the message says why.

    ``mistake`` is the id (in `_mistakes.MISTAKES`) of the mistake the message names, for
    a failure that names one without a ``Likely mistake: ...`` line; the runner reads
    that line itself."""

    def __init__(self, *args, mistake: str | None = None):
        super().__init__(*args)
        self.mistake = mistake


class NotImplementedYet(Exception):
    """Raised inside a case when the candidate raised `NotImplementedError`."""


class _TimedOut(BaseException):
    """Injected into a worker thread that ran over its time limit."""


TRIVIAL = 0.25
"""The weight of a trivial case (H = 1, T = 1, a round trip, a size-1 input): such a case
passes for many broken implementations, so it must not carry the score. One that an answer
doing no real work passes is also a support case (``Case(..., support=True)``)."""


@dataclass(frozen=True)
class Case:
    """One named case of a checker; ``run()`` raises `CaseFailed` on failure.

    ``weight`` is the case's share of the score (1 for an ordinary case, `TRIVIAL`
    for one that a broken implementation passes by accident). ``support`` marks a case that
    a degenerate answer passes (a constant, the input unchanged, the answer transposed, an
    off-by-one mask; a device, an argument check, attribute names): it counts only beside
    a passed case that is not a support case (see the module's docstring). ``covers`` names the
    arguments and modes of the target that the case sets away from their defaults
    (e.g. ``"dropout"``, ``"mode=train"``, ``"norm_first=True"``); a test checks that
    the cases of each checker together cover the whole contract.
    """

    name: str
    run: Callable[[], object]
    weight: float = 1.0
    covers: frozenset[str] = frozenset()
    support: bool = False


# ---------------------------------------------------------------- student code


def _student_frame(tb) -> traceback.FrameSummary | None:
    """The innermost traceback frame that belongs to the student's code: not the package's
    (a reference the exercise hands out, such as exercise 10's MultiHeadAttention, raises
    its ValueError in `_validate.py`; the line to show is the student's call), nor
    PyTorch's."""
    frames = traceback.extract_tb(tb)
    for frame in reversed(frames):
        path = os.path.abspath(frame.filename)
        if path.startswith(_PACKAGE_DIR + os.sep) or path.startswith(_TORCH_DIR + os.sep):
            continue
        if path == _THREADING_FILE:
            continue
        return frame
    return None


_ERROR_HINTS = (
    (
        "view size is not compatible",
        "after a transpose the tensor is not contiguous in memory: use `.reshape(...)` "
        "or call `.contiguous()` before `.view(...)`",
    ),
    (
        "expected scalar type",
        "two dtypes meet in one operation: create new tensors with the input's "
        "`dtype=x.dtype` (and `device=x.device`), not the default float32 nor a dtype "
        "of your own (the checker's inputs are float64 in most cases, float32 in some)",
    ),
    (
        "same dtype",
        "two dtypes meet in one operation: create new tensors with the input's "
        "`dtype=x.dtype` (and `device=x.device`), not the default float32 nor a dtype "
        "of your own (the checker's inputs are float64 in most cases, float32 in some)",
    ),
    (
        "leaf Variable that requires grad is being used in an in-place operation",
        "you changed an input in place (`x.mul_(...)`, `x += ...`, `x[...] = ...`): the "
        "checker's input requires grad, so PyTorch refuses; compute a new tensor and leave "
        "the inputs unchanged",
    ),
    (
        "more than one element of the written-to tensor refers to a single memory location",
        "you wrote in place into a tensor whose elements share memory (an input, or a "
        "view made by `expand`): compute a new tensor (`.clone()` first if you must write) "
        "and leave the inputs unchanged",
    ),
    (
        "before Module.__init__() call",
        "call `super().__init__()` first thing in your `__init__`",
    ),
    (
        "unexpected keyword argument",
        "keep the signature of the exercise stub: the checker calls your code with the "
        "contract's argument names",
    ),
    (
        "positional argument",
        "keep the signature of the exercise stub: the checker calls your code with the "
        "contract's arguments",
    ),
    (
        "on the expected device",
        "two tensors are on different devices: create every new tensor on the device of the "
        "inputs (`device=...`, e.g. `torch.arange(n, device=x.device)`), not on the CPU",
    ),
    (
        "cannot be multiplied",
        "check which dimensions you multiply: print the shapes of both operands",
    ),
)


def describe_exception(error: BaseException, what: str) -> str:
    """A one-paragraph description of an exception raised by student code."""
    text = str(error).strip().splitlines()
    first = text[0] if text else ""
    message = f"{what} raised {type(error).__name__}" + (f": {first}" if first else "")
    if hasattr(error, "remote_frame"):  # raised in the student's kernel (grading sandbox)
        frame = error.remote_frame
    else:
        frame = _student_frame(error.__traceback__)
    if frame is not None and frame.line:
        message += f"\nat line {frame.lineno} in {frame.name}: {frame.line.strip()}"
    for needle, hint in _ERROR_HINTS:
        if needle in str(error):
            message += f"\nHint: {hint}."
            break
    return message


def _snapshot(value):
    if isinstance(value, torch.Tensor) and value.device.type != "meta":  # meta holds no data
        return value.detach().clone()
    return None


def call_student(
    fn: Callable,
    *args,
    what: str,
    arg_names: Sequence[str] = (),
    error_hint: str | Callable[[str], str | None] | None = None,
    **kwargs,
):
    """Call student code; turn what can go wrong into `CaseFailed`.

    ``what`` names the call in messages, e.g. ``"soft_argmax(scores)"``.
    Tensor arguments are compared before and after the call to catch in-place
    changes of the inputs. ``arg_names`` names the positional arguments;
    ``error_hint`` is added to the message when the call raises; it may be a
    function of the error's text that returns the hint (or None for no hint).
    """
    before_args = [_snapshot(a) for a in args]
    before_kwargs = {k: _snapshot(v) for k, v in kwargs.items()}
    try:
        result = fn(*args, **kwargs)
    except NotImplementedError as error:
        if "meta tensor" not in str(error):  # PyTorch raises it for data on the meta device
            raise NotImplementedYet(str(error)) from None
        raise CaseFailed(
            describe_exception(error, what)
            + "\nHint: a tensor on the 'meta' device has no data: create the result on the "
            "requested `device` and do not move it (no `.cpu()`, `.item()` or `.tolist()`)."
        ) from None
    except _TimedOut:
        raise
    except BaseException as error:  # noqa: BLE001 - any student exception becomes a failed case
        message = describe_exception(error, what)
        hint = error_hint(str(error)) if callable(error_hint) else error_hint
        if hint and "\nHint:" not in message:
            message += f"\nHint: {hint}."
        raise CaseFailed(message) from None

    changed = []
    for i, (arg, before) in enumerate(zip(args, before_args)):
        if before is not None and not _same(arg, before):
            changed.append(arg_names[i] if i < len(arg_names) else f"argument {i + 1}")
    for key, before in before_kwargs.items():
        if before is not None and not _same(kwargs[key], before):
            changed.append(key)
    if changed:
        names = ", ".join(f"`{name}`" for name in changed)
        raise CaseFailed(
            f"{what} changed its input {names} in place (for example `x -= ...`, "
            "`x.masked_fill_(...)` or `x[...] = ...`): compute a new tensor and leave the "
            "inputs unchanged"
        )
    return result


def expect_value_error(
    call: Callable[[], object],
    what: str,
    name: str,
    *,
    example: str,
    other_error: str,
    returned: str,
) -> None:
    """``call()`` runs student code on a bad value of the argument ``name`` (``what`` says
    how): it must raise ValueError, and the message must name the argument. Otherwise the
    case fails, saying what to do: a message that does not name it gets an example message,
    ``ValueError(f'{example}')``; another exception gets the hint ``other_error``; returning
    without raising gets ``returned`` (why the value is bad)."""
    try:
        call()
    except ValueError as error:
        if name.lower() not in str(error).lower():
            raise CaseFailed(
                f"{what} raised ValueError({str(error)!r}): good, but the message should "
                f"name the argument `{name}`, e.g. ValueError(f'{example}')"
            ) from None
        return
    except NotImplementedError as error:
        raise NotImplementedYet(str(error)) from None
    except AssertionError as error:
        raise CaseFailed(
            describe_exception(error, what) + "\nHint: raise ValueError naming "
            f"`{name}`, not assert (an assert is not an error a caller can catch as bad "
            "input, and `python -O` removes it)."
        ) from None
    except Exception as error:  # noqa: BLE001 - any other exception is a failed case
        raise CaseFailed(describe_exception(error, what) + f"\nHint: {other_error}") from None
    raise CaseFailed(f"{what} returned without raising: {returned}")


def _same(now: torch.Tensor, before: torch.Tensor) -> bool:
    now = now.detach()
    if now.shape != before.shape or now.dtype != before.dtype:
        return False
    return bool(torch.equal(now, before)) or bool(
        torch.equal(torch.nan_to_num(now), torch.nan_to_num(before))
    )


# ---------------------------------------------------------------- candidates


def describe_kind(candidate) -> str:
    if isinstance(candidate, type):
        return f"the class `{candidate.__name__}`"
    if isinstance(candidate, nn.Module):
        return f"an instance of `{type(candidate).__name__}`"
    if inspect.isfunction(candidate) or inspect.ismethod(candidate):
        return f"the function `{candidate.__name__}`"
    return f"a value of type `{type(candidate).__name__}`"


def function_problem(candidate, target: str) -> str | None:
    """Why ``candidate`` is not a function we can check, or None."""
    if isinstance(candidate, type) or isinstance(candidate, nn.Module) or not callable(candidate):
        return (
            f"expected a function (your `{target}`), got {describe_kind(candidate)}: "
            f"pass the function itself, e.g. `check_{target}({target})`"
        )
    return None


def class_problem(candidate, target: str, class_name: str) -> str | None:
    """Why ``candidate`` is not an nn.Module subclass we can check, or None."""
    if isinstance(candidate, nn.Module):
        return (
            f"expected the class `{class_name}`, got an instance of it: pass the class "
            f"itself, e.g. `check_{target}({class_name})`, not `{class_name}(...)`"
        )
    if not isinstance(candidate, type):
        return (
            f"expected a class (a subclass of `nn.Module`), got {describe_kind(candidate)}: "
            f"pass your class, e.g. `check_{target}({class_name})`"
        )
    if not issubclass(candidate, nn.Module):
        return (
            f"`{candidate.__name__}` does not subclass `nn.Module`: write "
            f"`class {class_name}(nn.Module):` and call `super().__init__()` first"
        )
    return None


# ---------------------------------------------------------------- built-ins the task writes


class BuiltinNotAllowed(Exception):
    """Raised when the candidate calls the built-in it is asked to write."""


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # attention_course/


@contextlib.contextmanager
def forbid_builtins(targets: list[tuple[object, str]], message: str, *, package_may: bool = False):
    """While active, each ``getattr(owner, attr)`` of ``targets`` raises
    :class:`BuiltinNotAllowed` when called, with ``message`` and the name of the function
    called. With ``package_may``, calls from the package's own modules (the reference, a
    student's subclass of it) go through. Code that catches the refusal and goes on (a
    ``try``/``except`` around the built-in with a fallback) fails when the block ends: the
    task is to not call it. Each guard carries ``refusal`` = (exception name, message),
    which the grading sandbox forwards to the student's kernel."""
    refused: list[str] = []

    def guard(original, shown: str):
        text = f"{message} (your code called `{shown}`)"

        def forbidden(*args, **kwargs):
            if package_may:
                caller = sys._getframe(1).f_code.co_filename
                if os.path.abspath(caller).startswith(_PACKAGE + os.sep):
                    return original(*args, **kwargs)
            refused.append(shown)
            raise BuiltinNotAllowed(text)

        forbidden.refusal = (BuiltinNotAllowed.__name__, text)
        # its own code object (a watch for answer built-ins knows functions by their code)
        name = "refused_" + "".join(c if c.isalnum() else "_" for c in shown)
        forbidden.__code__ = forbidden.__code__.replace(co_name=name)
        return forbidden

    saved = [(owner, attr, getattr(owner, attr)) for owner, attr in targets]
    try:
        for owner, attr, original in saved:
            shown = f"{'F' if owner is F else getattr(owner, '__name__', owner)}.{attr}"
            setattr(owner, attr, guard(original, shown))
        yield
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)
    if refused:  # the refusal was raised, caught by the student's code, and ignored
        raise CaseFailed(
            f"your code called `{refused[0]}` and caught the exception it raised: {message}. "
            "A try/except around the built-in with a fallback still calls it; remove the call."
        )


def without_builtin(
    cases: list[Case], name: str, module_name: str, operations: str = "mean, var, sqrt"
) -> list[Case]:
    """``cases``, each run with ``F.<name>`` and ``torch.<name>`` forbidden: a candidate
    that calls the built-in it is asked to write (``nn.<module_name>`` calls it) fails;
    the message suggests ``operations``. (The reference implementations do not call them.)"""
    message = (
        f"do not call the built-in `F.{name}` or `torch.{name}` (nor `nn.{module_name}`, "
        f"which calls it): the task is to write it from tensor operations ({operations})"
    )

    def wrap(run):
        def wrapped():
            with forbid_builtins([(F, name), (torch, name)], message):
                return run()

        return wrapped

    return [dataclasses.replace(case, run=wrap(case.run)) for case in cases]


# ---------------------------------------------------------------- running


def _async_raise(thread: threading.Thread, exc_type: type[BaseException]) -> None:
    """Ask a runaway worker thread to stop (works when it is running Python code)."""
    if thread.ident is None:
        return
    try:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type)
        )
    except Exception:  # noqa: BLE001 - not CPython: the daemon thread just runs on
        pass


WALL_FACTOR = 10.0  # a case's wall-time guard: this many times its CPU-time limit
WALL_FLOOR = 5.0  # ... and never less than this many seconds


_WALL_TIME_LIMITS = threading.local()


@contextlib.contextmanager
def limits_in_wall_time():
    """Within this block, a case's limit is wall time, with no guard.

    For the grader (`attention_course.grading.sandbox`): there the candidate runs in another
    process, whose CPU seconds the grader limits itself; this process only waits.
    """
    before = getattr(_WALL_TIME_LIMITS, "on", False)
    _WALL_TIME_LIMITS.on = True
    try:
        yield
    finally:
        _WALL_TIME_LIMITS.on = before


def _wall_guard(timeout: float) -> float:
    """How long a case may wait (sleep, a lock, ``input()``) while it uses no CPU."""
    if getattr(_WALL_TIME_LIMITS, "on", False):
        return timeout
    return max(timeout * WALL_FACTOR, WALL_FLOOR)


def _run_in_thread(fn: Callable[[], object], timeout: float) -> tuple[str, object]:
    """Run ``fn`` in a daemon thread: ("ok", value), ("error", exc), or ("timeout", None),
    ("waited", None) or ("wall", None) when it was stopped.

    The limit counts the CPU seconds of this process (every thread of it: PyTorch's own
    worker threads too), not wall time: a machine loaded by other jobs slows a case down
    but does not give it more CPU seconds, so the verdict does not depend on the load.
    A case that waits without using the CPU is stopped after :func:`_wall_guard` seconds.
    Within :func:`limits_in_wall_time` the limit is wall time ("wall").
    """
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as error:  # noqa: BLE001 - reported to the main thread
            box["error"] = error

    cpu_start, wall_start = time.process_time(), time.monotonic()
    guard = _wall_guard(timeout)
    wall_only = getattr(_WALL_TIME_LIMITS, "on", False)
    context = contextvars.copy_context()  # the run seed (`_data.drawing_from`) goes along
    thread = threading.Thread(
        target=lambda: context.run(target), name="attention-course-check", daemon=True
    )
    thread.start()
    status = None
    while status is None:
        thread.join(min(0.05, timeout))
        if not thread.is_alive():
            break
        if time.process_time() - cpu_start > timeout and not wall_only:
            status = "timeout"
        elif time.monotonic() - wall_start > guard:
            status = "wall" if wall_only else "waited"
    if status is not None:
        _async_raise(thread, _TimedOut)
        return status, None
    if "error" in box:
        return "error", box["error"]
    return "ok", box.get("value")


def run_cases(target: str, cases: Sequence[Case], timeout: float) -> Report:
    """Run ``cases`` one by one and collect a `Report` named ``check_<target>``.

    The global RNG (what dropout draws from) is seeded from the run seed
    (`_data.drawing_from`), and restored afterwards."""
    report = Report(target=f"check_{target}")
    report.covered = frozenset().union(*(case.covers for case in cases))
    timeout = float(timeout)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case_seed(0))  # what a case draws from the global RNG (dropout)
        timed_out_case = None
        first_failure_with: dict[str, str] = {}  # message -> first case that failed with it
        for case in cases:
            if timed_out_case is not None:
                report.results.append(
                    CaseResult(
                        case.name,
                        False,
                        f"not run: the case '{timed_out_case}' ran over the time limit",
                        case.weight,
                    )
                )
                continue
            status, value = _run_in_thread(case.run, timeout)
            if status in ("timeout", "waited", "wall"):
                timed_out_case = case.name
                if status == "wall":
                    message = (
                        f"ran over the time limit of {timeout:g} s: look for an endless loop, "
                        "or a loop over elements that should be one tensor operation"
                    )
                elif status == "timeout":
                    message = (
                        f"ran over the time limit of {timeout:g} s of CPU time: look for an "
                        "endless loop, or a loop over elements that should be one tensor "
                        "operation"
                    )
                else:
                    message = (
                        f"ran over the time limit: it waited {_wall_guard(timeout):g} s "
                        "without finishing (sleeping, reading input or waiting for a lock?)"
                    )
                report.results.append(CaseResult(case.name, False, message, case.weight))
            elif status == "ok":
                message = value if isinstance(value, str) else ""
                report.results.append(CaseResult(case.name, True, message, case.weight))
            elif isinstance(value, NotImplementedYet):
                detail = str(value)
                message = NOT_IMPLEMENTED_MESSAGE
                if "missing the required" in detail:
                    message += f" ({detail})"
                return Report(
                    target=report.target, results=[CaseResult("implemented", False, message)]
                )
            elif isinstance(value, CaseFailed):
                message = str(value)
                mistake = value.mistake or mistake_in(message)
                earlier = first_failure_with.get(message)
                if earlier is None:
                    first_failure_with[message] = case.name
                else:
                    message = f"the same failure as in the case '{earlier}'"
                report.results.append(
                    CaseResult(case.name, False, message, case.weight, mistake=mistake)
                )
            else:
                report.results.append(
                    CaseResult(
                        case.name,
                        False,
                        "the checker itself failed on this case (please report it): "
                        + describe_exception(value, "the checker"),
                        case.weight,
                    )
                )
    return without_unearned_support(report, cases)


def without_unearned_support(report: Report, cases: Sequence[Case]) -> Report:
    """``report``, where the support cases weigh 0 unless a case that is not a support case
    passed: an answer that passes only what a degenerate answer passes scores 0. The
    results keep their messages; only their weights change."""
    support = {case.name for case in cases if case.support}
    earned = any(r.passed and r.name not in support for r in report.results)
    if earned or not support:
        return report
    report.results = [
        dataclasses.replace(r, weight=0.0) if r.name in support else r for r in report.results
    ]
    return report


def single_failure(target: str, name: str, message: str) -> Report:
    """A report with one failed case, for a candidate we cannot even start on."""
    return Report(target=f"check_{target}", results=[CaseResult(name, False, message)])


def _checker_doc(summary: str | None, class_name: str | None) -> str:
    """A checker's docstring: the case builder's, then its arguments and its result."""
    what = f"the class ``{class_name}`` (not an instance)" if class_name else "the function"
    return (
        inspect.cleandoc(summary or "")
        + f"""

Args:
    candidate: {what} to check, e.g. the student's own.
    timeout: seconds of CPU time each case may take (10 by default).
    seed: the run seed the random inputs are drawn from (0, the default, gives the
        inputs the check cells show; the grader passes a fresh one).

Returns:
    A `Report`: ``print(report)`` shows a ✓/✗ line per case, ``report.passed``,
    ``report.score`` and ``report.mistakes`` (the ids of the known mistakes named)
    serve a grader.
"""
    )


def checker(
    target: str,
    class_name: str | None = None,
    *,
    answer_builtins: Sequence[str] = (),
    forbid: bool = True,
    chapter: str | None = None,
    holds_answer: Sequence[str] = (),
):
    """Turn ``cases(candidate) -> list[Case]`` into
    ``check_<target>(candidate, *, timeout=10.0, seed=0)``.

    ``seed`` is the run seed every drawn input follows (`_data.drawing_from`): 0, the
    default, gives the inputs the check cells show; the grader passes a fresh seed for
    each grading run, so outputs recorded for the check cell's inputs do not pass there.
    Inputs written out by hand are the same for every seed.

    The checker first makes sure that the candidate is a function (or, given
    ``class_name``, an ``nn.Module`` subclass), else it returns a one-case report saying
    what to pass; then it runs the cases with :func:`run_cases`.

    ``answer_builtins`` names, by their full dotted paths, the PyTorch built-ins that *are*
    the answer to the task (``"torch.nn.functional.layer_norm"``, ``"torch.nn.LayerNorm"``):
    the task's policy (`attention_course.checks._policy`) forbids them: the check cell, in a
    notebook, and the grader give 0 to a solution that uses one, with the same message.
    ``forbid=False`` makes them notes for the instructor only (the statement does not
    forbid them). List only a built-in that does the whole task, not one a solution may
    use as a step.
    ``chapter`` names the book chapter that teaches the target (``"07_layernorm"``), for
    the tiered hints of `Report.hint`. Both are kept as attributes of the checker.
    ``holds_answer`` names, by their dotted paths, building blocks the exercise hands out
    for *other* tasks that are made of this task's target (exercise 13's ``step_decoder``
    gives a GPT made of ``CausalSelfAttention``): this task's solution may not use them,
    in the check cell and in the grader alike (`attention_course.checks._scan`).

    The decorated function builds the cases (``-> list[Case]``); it stays reachable as
    ``check.cases``. The checker shows its own signature, ``(candidate, *, timeout=10.0,
    seed=0) -> Report``, to ``inspect.signature``, ``help()`` and the docs, with real
    annotations (not strings), and its docstring is the case builder's followed by what
    the arguments and the result are.
    """

    def wrap(cases: Callable[[object], Sequence[Case]]) -> Callable[..., Report]:
        def check(candidate, *, timeout: float = 10.0, seed: int = 0) -> Report:
            if class_name is None:
                problem, need = function_problem(candidate, target), "is a function"
            else:
                problem = class_problem(candidate, target, class_name)
                need = "is an nn.Module class"
            if problem:
                return single_failure(target, need, problem)
            broken = policy_problem(
                candidate, target, check.answer_builtins if forbid else (), class_name
            )
            if broken:
                return single_failure(target, "follows the task's rules", broken)
            with drawing_from(seed):
                return run_cases(target, cases(candidate), timeout)

        check.__name__ = check.__qualname__ = f"check_{target}"
        check.__doc__ = _checker_doc(cases.__doc__, class_name)
        check.__module__ = cases.__module__
        # real objects, not the strings of `from __future__ import annotations`, for
        # inspect.signature, help() and the docs
        check.__annotations__ = {
            "candidate": type if class_name else Callable,
            "timeout": float,
            "seed": int,
            "return": Report,
        }
        check.cases = cases
        check.target = target
        check.answer_builtins = tuple(answer_builtins)
        check.forbid = forbid
        check.holds_answer = tuple(holds_answer)
        check.chapter = chapter
        return check

    return wrap
