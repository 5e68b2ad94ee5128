"""One policy per task: the check cell, in a notebook, says what the grader says.

A task's policy (`attention_course.checks._policy`) forbids the built-ins its checker
declares as the answer (unless the checker says ``forbid=False``) and the package's own
reference of its target. The check cell scans the cells the kernel ran (IPython's ``In``)
with the grader's own static scan; these tests play a kernel: a ``__main__`` whose ``In``
holds the cells, and functions defined there.
"""

import json
import re
import sys
from pathlib import Path

import pytest

from attention_course.checks import CHECKERS, check_causal_mask, check_soft_argmax
from attention_course.checks._policy import breaks_policy, policy_record
from attention_course.checks._scan import Finding

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def kernel(monkeypatch):
    """Run cells as a notebook kernel would: in ``__main__``'s namespace, recorded in ``In``."""
    main = sys.modules["__main__"]
    history = [""]
    monkeypatch.setattr(main, "In", history, raising=False)
    namespace = {"__name__": "__main__"}

    def run(*cells):
        for source in cells:
            history.append(source)
            exec(compile(source, f"<cell {len(history) - 1}>", "exec"), namespace)
        return namespace

    return run


SETUP = "import torch\nimport torch.nn.functional as F\nimport attention_course as ac\n"

SOFTMAX = """\
def soft_argmax(scores, beta=1.0, dim=-1):
    return torch.softmax(beta * scores, dim=dim)
"""

ALIASED = """\
from torch import softmax as sm

def soft_argmax(scores, beta=1.0, dim=-1):
    return sm(beta * scores, dim=dim)
"""

METHOD = """\
def soft_argmax(scores, beta=1.0, dim=-1):
    return (beta * scores).softmax(dim)
"""

HELPER = """\
def normalise(z, dim):
    return F.softmax(z, dim=dim)
"""

USES_HELPER = """\
def soft_argmax(scores, beta=1.0, dim=-1):
    return normalise(beta * scores, dim)
"""

OWN = """\
def soft_argmax(scores, beta=1.0, dim=-1):
    e = torch.exp(beta * scores - (beta * scores).amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)
"""


@pytest.mark.parametrize(
    "cells, where",
    [
        ([SOFTMAX], "`torch.softmax`"),
        ([ALIASED], "`torch.softmax`"),
        ([METHOD], "`torch.Tensor.softmax`"),
        ([HELPER, USES_HELPER], "`torch.nn.functional.softmax`"),
    ],
    ids=["direct", "aliased-import", "tensor-method", "in-a-helper-cell"],
)
def test_a_forbidden_builtin_fails_the_check_cell_with_the_line(kernel, cells, where):
    ns = kernel(SETUP, *cells)
    report = check_soft_argmax(ns["soft_argmax"])
    assert not report.passed and report.score == 0
    assert [r.name for r in report.results] == ["follows the task's rules"]
    text = str(report)
    assert where in text and "In [" in text and "does not allow it" in text, text


def test_an_own_solution_passes_and_outside_a_notebook_nothing_is_scanned(kernel):
    ns = kernel(SETUP, OWN)
    assert check_soft_argmax(ns["soft_argmax"]).passed
    # a candidate from a module (a test, a script): no cells to scan, the checks decide
    import torch

    def soft_argmax(scores, beta=1.0, dim=-1):
        return torch.softmax(beta * scores, dim=dim)

    assert check_soft_argmax(soft_argmax).passed


def test_the_own_targets_reference_fails_the_check_cell(kernel):
    ns = kernel(
        SETUP, "def causal_mask(size, device=None):\n    return ac.causal_mask(size, device)\n"
    )
    report = check_causal_mask(ns["causal_mask"])
    assert not report.passed
    assert "calls the reference `attention_course.causal_mask`" in str(report)


def test_a_builtin_the_task_does_not_forbid_is_no_failure(kernel):
    # exercise 05's statement does not forbid nn.Transformer's mask: a note in the grader
    cell = (
        "def causal_mask(size, device=None):\n"
        "    m = torch.nn.Transformer.generate_square_subsequent_mask(size, device=device)\n"
        "    return m == 0\n"
    )
    ns = kernel(SETUP, cell)
    report = check_causal_mask(ns["causal_mask"])
    assert report.passed, str(report)
    record = policy_record(CHECKERS["causal_mask"])
    assert record["forbidden"] == [] and record["answer_builtins"]


def test_the_grader_zeroes_exactly_what_the_policy_forbids():
    from attention_course.grading.grade import TaskGrade, _apply_findings

    def grade_with(finding, forbidden):
        grade = TaskGrade(
            id="t", name="t", kind="check", points=2, score=2.0, fraction=1.0, passed=True
        )
        _apply_findings(grade, [finding], None, False, forbidden)
        return grade

    builtin = Finding("t", "builtin", 3, 1, "torch.nn.Transformer.generate_square_subsequent_mask")
    noted = grade_with(builtin, [])
    assert noted.score == 2.0 and noted.passed and "a note" in noted.notes[0]
    zeroed = grade_with(builtin, [builtin.what])
    assert zeroed.score == 0 and not zeroed.passed
    assert breaks_policy(builtin, [builtin.what]) and not breaks_policy(builtin, [])
    # the scan reports a reference only when the exercise does not hand it out
    own = Finding("t", "reference", 3, 1, "attention_course.causal_mask")
    assert breaks_policy(own, [])
    dynamic = Finding("t", "dynamic", 3, 1, "runs code from a string (`exec`)")
    assert not breaks_policy(dynamic, [])  # a note: the reference is absent in the grader


def _statement(nb: dict, solution_cell: str) -> str:
    """The markdown between the previous task's check cell (or the start) and the task's
    solution cell: the task's statement."""
    text: list[str] = []
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade_id") == solution_cell:
            return "\n".join(text)
        if meta.get("grade") and cell["cell_type"] == "code":
            text = []
        elif cell["cell_type"] == "markdown":
            text.append("".join(cell["source"]))
    raise AssertionError(f"no solution cell {solution_cell}")


def _words(name: str) -> str:
    return re.sub(r"[^a-z]", "", name.lower())


def test_every_statement_quotes_its_tasks_forbidden_builtins():
    tasks = json.loads((ROOT / "attention_course" / "exercise_tasks.json").read_text())
    missing = []
    for exercise, items in tasks.items():
        nb = json.loads((ROOT / "exercises" / f"{exercise}.ipynb").read_text())
        for task in items:
            checker = CHECKERS.get(str(task.get("checker", "")).removeprefix("check_"))
            if checker is None:
                continue
            statement = _words(_statement(nb, task["solution_cell"]))
            for path in policy_record(checker)["forbidden"]:
                # torch.native_layer_norm is the operator behind F.layer_norm: quoted with it
                name = path.rsplit(".", 1)[-1].removeprefix("native_").lstrip("_")
                if _words(name) not in statement:
                    missing.append(f"{exercise}: {task['name']}: {path}")
    assert missing == []
