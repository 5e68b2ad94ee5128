"""One policy per task: the check cell, in a notebook, says what the grader says.

A task's policy (`attention_course.checks._policy`) forbids the built-ins its checker
declares as the answer (unless the checker says ``forbid=False``) and the package's own
reference of its target. The check cell scans the cells the kernel ran (IPython's ``In``)
with the grader's own static scan; these tests play a kernel: a ``__main__`` whose ``In``
holds the cells, and functions defined there.
"""

import ast
import json
import sys
from pathlib import Path

import pytest

from attention_course.checks import CHECKERS, check_causal_mask, check_soft_argmax
from attention_course.checks._policy import breaks_policy, policy_problem, policy_record
from attention_course.checks._scan import Finding, scan_notebook

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


def test_an_own_solution_passes_and_outside_a_notebook_nothing_is_scanned(kernel, monkeypatch):
    ns = kernel(SETUP, OWN)
    assert check_soft_argmax(ns["soft_argmax"]).passed
    # outside a notebook (a test, a script: no `In`), no cells to scan: the checks decide
    monkeypatch.delattr(sys.modules["__main__"], "In")
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

    def grade_with(finding, forbidden, sandboxed=True):
        grade = TaskGrade(
            id="t", name="t", kind="check", points=2, score=2.0, fraction=1.0, passed=True
        )
        _apply_findings(grade, [finding], None, False, forbidden, sandboxed=sandboxed)
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
    for what in (dynamic, Finding("t", "watch", 3, 1, "attention_course.grading.cheats")):
        kept = grade_with(what, None)
        assert kept.score == 2.0 and kept.passed and kept.reason == ""
        assert kept.notes == [what.message() + SANDBOXED_NOTE], kept.notes
        unconfined = grade_with(what, None, sandboxed=False)
        assert unconfined.score == 2.0 and "graded WITHOUT the sandbox" in unconfined.notes[0]
    assert grade_with(own, None).score == 0  # the reference costs the points either way


SANDBOXED_NOTE = (
    " (a note for the instructor: in the sandbox the references are absent, so it was graded "
    "by what it does)"
)


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


def _spellings(path: str) -> list[str]:
    """How a statement may write the built-in ``path``: ``torch.nn.functional.softmax`` as
    ``F.softmax``, ``torch.nn.LayerNorm`` as ``nn.LayerNorm``, ``torch.Tensor.softmax`` as
    ``x.softmax``..."""
    name = path.rsplit(".", 1)[-1]
    if path.startswith("torch.nn.functional."):
        return [path, f"F.{name}", f"nn.functional.{name}"]
    if path.startswith("torch.Tensor."):
        return [f"Tensor.{name}", f"x.{name}", f"tensor.{name}"]
    if path.startswith("torch.nn."):
        return [path, path.removeprefix("torch.")]
    return [path]


def test_every_statement_quotes_its_tasks_forbidden_builtins():
    # by a real spelling of each (not the task's own name: exercise 04's task *is* called
    # scaled_dot_product_attention); the operators behind a built-in (torch.native_layer_norm,
    # torch._C...) are quoted with it
    tasks = json.loads((ROOT / "attention_course" / "exercise_tasks.json").read_text())
    missing = []
    for exercise, items in tasks.items():
        nb = json.loads((ROOT / "exercises" / f"{exercise}.ipynb").read_text())
        for task in items:
            checker = CHECKERS.get(str(task.get("checker", "")).removeprefix("check_"))
            if checker is None:
                continue
            statement = _statement(nb, task["solution_cell"])
            for path in policy_record(checker)["forbidden"]:
                name = path.rsplit(".", 1)[-1]
                if name.startswith(("native_", "_")) or path.startswith("torch._C."):
                    continue
                if not any(f"`{spelling}" in statement for spelling in _spellings(path)):
                    missing.append(f"{exercise}: {task['name']}: {path}")
    assert missing == []


# ---------------------------------------------------------------- every solved twin


def _released():
    tasks = json.loads((ROOT / "attention_course" / "exercise_tasks.json").read_text())
    given = json.loads((ROOT / "attention_course" / "exercise_given.json").read_text())
    return tasks, given


def _cells(nb: dict) -> list[str]:
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def _solution_index(nb: dict, task: dict) -> int:
    """The index of ``task``'s solution cell in the notebook ``nb`` (as JSON)."""
    return next(
        i
        for i, c in enumerate(nb["cells"])
        if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == task["solution_cell"]
    )


def _check_cell_verdict(monkeypatch, cells: list[str], task: dict) -> str:
    """What the check cell's policy says of ``task`` in a kernel that ran ``cells``."""
    monkeypatch.setattr(sys.modules["__main__"], "In", ["", *cells], raising=False)
    candidate = type("Candidate", (), {"__module__": "__main__"})  # only its name is read
    candidate.__name__ = task["name"]
    checker = CHECKERS[task["checker"].removeprefix("check_")]
    return policy_problem(candidate, checker.target, policy_record(checker)["forbidden"])


def _grader_verdict(nb: dict, task: dict, given: dict) -> list[str]:
    """The findings the grader zeroes ``task`` for (`grade._apply_findings`)."""
    import nbformat

    from attention_course.grading.grade import _policy

    record = {**task, **_policy(task)}
    book = nbformat.reads(json.dumps(nb), 4)
    findings = scan_notebook(book, [record], given).get(task["id"], [])
    return [f.message() for f in findings if breaks_policy(f, record.get("forbidden", []))]


def _forbidden_line(path: str) -> str:
    """A line that uses the built-in ``path``, as a student would write it."""
    if path.startswith("torch.Tensor."):
        return f"    _unused = torch.zeros(2).{path.rsplit('.', 1)[-1]}"
    return f"    _unused = {path}"


EXERCISES = sorted(_released()[0])


@pytest.mark.parametrize("exercise", EXERCISES)
def test_check_cell_and_grader_agree_on_every_solved_twin(exercise, monkeypatch):
    """The solved twin: neither side objects. The same twin with each forbidden built-in
    used in a task's solution: both object, naming the same built-in."""
    pytest.importorskip("nbformat")
    tasks, given = _released()
    nb = json.loads((ROOT / "exercises" / "solutions" / f"{exercise}.ipynb").read_text())
    checks = [t for t in tasks[exercise] if t["kind"] == "check"]
    for task in checks:
        assert _check_cell_verdict(monkeypatch, _cells(nb), task) == "", task["name"]
        assert _grader_verdict(nb, task, given[exercise]) == [], task["name"]
    for task in checks:
        checker = CHECKERS[task["checker"].removeprefix("check_")]
        for path in policy_record(checker)["forbidden"]:
            mutated = json.loads(json.dumps(nb))
            cell = next(
                c
                for c in mutated["cells"]
                if c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
                == task["solution_cell"]
            )
            source = "".join(cell["source"])
            # the line goes into the body of the task's own def or class
            tree = ast.parse(source)
            node = next(
                n
                for n in tree.body
                if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == task["name"]
            )
            body = (
                node
                if isinstance(node, ast.FunctionDef)
                else next(n for n in node.body if isinstance(n, ast.FunctionDef))
            )
            lines = source.split("\n")
            first = body.body[0].lineno - 1
            indent = len(lines[first]) - len(lines[first].lstrip())
            lines.insert(first, " " * (indent - 4) + _forbidden_line(path))
            cell["source"] = "\n".join(lines)
            short = path.rsplit(".", 1)[-1]
            check_says = _check_cell_verdict(monkeypatch, _cells(mutated), task)
            grader_says = _grader_verdict(mutated, task, given[exercise])
            assert short in check_says, (task["name"], path, check_says)
            assert any(short in m for m in grader_says), (task["name"], path, grader_says)


def test_the_package_rope_given_for_one_task_is_not_allowed_in_another(monkeypatch):
    # exercise 14 imports the package's RoPE for its rope_attention task; task 1 asks for
    # apply_rope itself: a task 1 that calls it fails in the check cell and in the grader
    pytest.importorskip("nbformat")
    tasks, given = _released()
    exercise = "14_positions_that_generalise"
    nb = json.loads((ROOT / "exercises" / "solutions" / f"{exercise}.ipynb").read_text())
    task = next(t for t in tasks[exercise] if t["name"] == "apply_rope")
    cell = nb["cells"][_solution_index(nb, task)]
    cell["source"] = (
        "def apply_rope(x, positions=None, base=10000.0):\n"
        "    return package_rope(x, positions, base)\n"
    )
    check_says = _check_cell_verdict(monkeypatch, _cells(nb), task)
    grader_says = _grader_verdict(nb, task, given[exercise])
    assert "calls the reference `attention_course.apply_rope`" in check_says
    assert any("calls the reference `attention_course.apply_rope`" in m for m in grader_says)
    # rope_attention (a computed quiz), the task it is given for, may call it (the solved
    # twin does): the grader finds nothing there
    import nbformat

    other = next(t for t in tasks[exercise] if t["name"] == "rope_attention")
    book = nbformat.reads(json.dumps(nb), 4)
    assert "package_rope(q)" in "".join(c.source for c in book.cells)
    assert scan_notebook(book, [other], given[exercise]).get(other["id"], []) == []


@pytest.mark.parametrize(
    "source",
    [
        # the class of the given model's attention, reached through `type(...)`
        "class CausalSelfAttention(type(step_decoder().gpt.blocks[0].attn)):\n    pass\n",
        # a wrapper that lends its own weights to an instance of that class
        "class CausalSelfAttention(nn.Module):\n"
        "    def __init__(self, d_model, num_heads, bias=False, dropout=0.0):\n"
        "        super().__init__()\n"
        "        self.w_q = nn.Linear(d_model, d_model, bias=bias)\n"
        "        self.w_k = nn.Linear(d_model, d_model, bias=bias)\n"
        "        self.w_v = nn.Linear(d_model, d_model, bias=bias)\n"
        "        self.w_o = nn.Linear(d_model, d_model, bias=bias)\n"
        "        self.num_heads, self.dropout = num_heads, dropout\n"
        "        kind = type(step_decoder().gpt.blocks[0].attn)\n"
        "        object.__setattr__(self, 'inner', kind(d_model, num_heads, bias=bias))\n"
        "    def forward(self, x):\n"
        "        self.inner.load_state_dict(self.state_dict(), strict=False)\n"
        "        return self.inner(x)\n",
    ],
    ids=["subclass", "wrapper"],
)
def test_a_given_block_made_of_the_target_is_not_allowed_in_its_task(monkeypatch, source):
    # exercise 13 gives `step_decoder` for `generate`; its GPT is made of the reference
    # CausalSelfAttention, so task 2 may not use it (the checker's `holds_answer`): both
    # the check cell and the grader say so (the sandboxed grader also serves the model:
    # no causal self-attention exists there at all)
    pytest.importorskip("nbformat")
    tasks, given = _released()
    exercise = "13_decoder_only"
    nb = json.loads((ROOT / "exercises" / "solutions" / f"{exercise}.ipynb").read_text())
    task = next(t for t in tasks[exercise] if t["name"] == "CausalSelfAttention")
    nb["cells"][_solution_index(nb, task)]["source"] = source
    want = "the solution uses `step_decoder`, which the exercise gives for another task"
    assert want in _check_cell_verdict(monkeypatch, _cells(nb), task)
    assert any(want in m for m in _grader_verdict(nb, task, given[exercise]))
    # `generate`, the task it is given for, may use it (the solved twin's check cell does)
    import nbformat

    other = next(t for t in tasks[exercise] if t["name"] == "generate")
    book = nbformat.reads(json.dumps(nb), 4)
    assert scan_notebook(book, [other], given[exercise]).get(other["id"], []) == []


def test_an_edited_and_rerun_cell_is_judged_on_its_last_run(kernel):
    # the kernel's history keeps every run: the first (with the built-in) is superseded
    ns = kernel(SETUP, SOFTMAX, OWN)
    assert check_soft_argmax(ns["soft_argmax"]).passed
    # ... and the other way round, the built-in is what runs
    ns = kernel(OWN, SOFTMAX)
    assert not check_soft_argmax(ns["soft_argmax"]).passed


@pytest.mark.parametrize("last", ["own", "builtin"])
def test_a_notebook_that_defines_a_task_twice_is_judged_on_the_last_definition(monkeypatch, last):
    # the saved notebook, as the grader reads it, and the same cells as a kernel's history
    pytest.importorskip("nbformat")
    tasks, given = _released()
    exercise = "01_attention_over_sets"
    nb = json.loads((ROOT / "exercises" / "solutions" / f"{exercise}.ipynb").read_text())
    task = next(t for t in tasks[exercise] if t["name"] == "soft_argmax")
    index = _solution_index(nb, task)
    extra = {"cell_type": "code", "id": "again", "metadata": {}, "outputs": []}
    extra["execution_count"] = None
    nb["cells"][index]["source"] = SOFTMAX if last == "own" else OWN
    nb["cells"].insert(index + 1, {**extra, "source": OWN if last == "own" else SOFTMAX})
    check_says = _check_cell_verdict(monkeypatch, _cells(nb), task)
    grader_says = _grader_verdict(nb, task, given[exercise])
    if last == "own":
        assert check_says == "" and grader_says == []
    else:
        assert "`torch.softmax`" in check_says
        assert any("`torch.softmax`" in m for m in grader_says)


@pytest.mark.parametrize(
    "cells",
    [
        ["soft_argmax = lambda scores, beta=1.0, dim=-1: torch.softmax(beta * scores, dim=dim)\n"],
        [
            "class SA:\n    def __call__(self, scores, beta=1.0, dim=-1):\n"
            "        return F.softmax(beta * scores, dim=dim)\n",
            "soft_argmax = SA()\n",
        ],
    ],
    ids=["lambda", "instance"],
)
def test_a_name_bound_by_assignment_is_judged_too(kernel, cells):
    # the grader finds the task by its name, whatever binds it: so does the check cell
    ns = kernel(SETUP, *cells)
    report = check_soft_argmax(ns["soft_argmax"])
    assert not report.passed and "softmax`" in str(report), str(report)


def test_an_alias_of_the_reference_is_judged_by_its_name(kernel):
    ns = kernel(SETUP, "causal_mask = ac.causal_mask\n")
    report = check_causal_mask(ns["causal_mask"])
    assert not report.passed
    assert "calls the reference `attention_course.causal_mask`" in str(report)


@pytest.mark.parametrize(
    "first",
    [
        "soft_argmax = lambda scores, beta=1.0, dim=-1: torch.softmax(beta * scores, dim=dim)\n",
        "from torch import softmax as soft_argmax\n",
    ],
    ids=["lambda-then-def", "import-then-def"],
)
def test_a_binding_replaced_by_a_later_def_is_not_judged(kernel, first):
    ns = kernel(SETUP, first, OWN)
    report = check_soft_argmax(ns["soft_argmax"])
    assert report.passed, str(report)


def test_the_grader_also_judges_the_last_binding(monkeypatch):
    pytest.importorskip("nbformat")
    tasks, given = _released()
    exercise = "01_attention_over_sets"
    nb = json.loads((ROOT / "exercises" / "solutions" / f"{exercise}.ipynb").read_text())
    task = next(t for t in tasks[exercise] if t["name"] == "soft_argmax")
    index = _solution_index(nb, task)
    lazy = "soft_argmax = lambda s, beta=1.0, dim=-1: torch.softmax(beta * s, dim=dim)\n"
    cell = {"cell_type": "code", "id": "lazy", "metadata": {}, "outputs": []}
    cell["execution_count"] = None
    nb["cells"].insert(index, {**cell, "source": lazy})  # before the solution's def
    assert _check_cell_verdict(monkeypatch, _cells(nb), task) == ""
    assert _grader_verdict(nb, task, given[exercise]) == []
    nb["cells"].insert(index + 2, {**cell, "id": "lazy-again", "source": lazy})  # after it
    assert "`torch.softmax`" in _check_cell_verdict(monkeypatch, _cells(nb), task)
    assert any("`torch.softmax`" in m for m in _grader_verdict(nb, task, given[exercise]))


def test_an_unused_reference_import_in_the_solution_cell_fails_both_sides(kernel):
    # the grader scans the whole solution cell; the check cell the cell that last bound the
    # task's name (exercise 15 does not give RollingAttentionCache to rolling_update)
    from attention_course.checks import check_rolling_update

    cell = (
        "from attention_course.kv import RollingAttentionCache  # noqa\n\n"
        "def rolling_update(buffer, slot_positions, new, start):\n"
        "    raise NotImplementedError\n"
    )
    ns = kernel(SETUP, cell)
    report = check_rolling_update(ns["rolling_update"])
    assert not report.passed
    assert "RollingAttentionCache" in str(report), str(report)
