"""Adversarial submissions (tests/fixtures/adv_*.ipynb.json, made by make_adversarial.py):
no false pass, and the reason is named.

Static findings are tested without a kernel; each notebook that needs a kernel is
graded once (module-scoped fixtures, 10-20 s each on two cores).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from attention_course.checks import CHECKERS  # noqa: E402
from attention_course.grading import grade as grading  # noqa: E402
from attention_course.grading.cheats import scan_notebook  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ROOT = FIXTURES.parents[1]
SOLVED = ROOT / "exercises" / "solutions" / "04_scaled_dot_product.ipynb"
TASK1 = "scaled_dot_product_attention"


def _nb(name):
    return nbformat.read(FIXTURES / f"{name}.ipynb.json", as_version=4)


def _copy(name, tmp_path_factory):
    folder = tmp_path_factory.mktemp(name)
    path = folder / f"{name}.ipynb"
    shutil.copy(FIXTURES / f"{name}.ipynb.json", path)
    return path


def _by_name(grade):
    return {t.name: t for t in grade.tasks}


# ---------------------------------------------------------------- static, no kernel


@pytest.mark.parametrize(
    ("name", "task", "kind", "needle"),
    [
        ("adv_reference_wrapper", TASK1, "reference", "ac.scaled_dot_product_attention"),
        ("adv_reference_alias", TASK1, "reference", "import scaled_dot_product_attention as"),
        ("adv_importlib", TASK1, "dynamic", "importlib.import_module"),
        ("adv_builtin_sdpa", TASK1, "builtin", "F.scaled_dot_product_attention"),
        ("adv_layernorm_builtin", "LayerNorm", "builtin", "nn.functional.layer_norm"),
    ],
)
def test_static_scan_names_the_cheat(name, task, kind, needle):
    nb = _nb(name)
    findings = scan_notebook(nb, grading.find_tasks(nb))
    assert set(findings) == {task}, findings
    assert any(f.kind == kind and needle in f.code for f in findings[task]), findings


def test_honest_solutions_have_no_findings():
    for path in sorted((ROOT / "exercises").glob("**/*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        assert scan_notebook(nb, grading.find_tasks(nb)) == {}, path


def test_answer_builtins_are_declared_next_to_the_checkers():
    assert CHECKERS["scaled_dot_product_attention"].answer_builtins == (
        "torch.nn.functional.scaled_dot_product_attention",
    )
    assert "torch.nn.LayerNorm" in CHECKERS["layer_norm"].answer_builtins
    assert "torch.nn.MultiheadAttention" in CHECKERS["multi_head_attention"].answer_builtins
    assert CHECKERS["split_heads"].answer_builtins == ()  # no built-in is the answer


@pytest.mark.slow
def test_corrupt_notebooks_exit_2_with_a_named_error(tmp_path, capsys):
    for name, needle in [("adv_not_json", "NotJSONError"), ("adv_not_a_notebook", "")]:
        path = tmp_path / f"{name}.ipynb"
        shutil.copy(FIXTURES / f"{name}.ipynb.json", path)
        assert grading.main([str(path)]) == 2
        err = capsys.readouterr().err
        assert f"cannot read {path}" in err and needle in err, err


# ---------------------------------------------------------------- graded in a kernel


@pytest.fixture(scope="module")
def importlib_grade(tmp_path_factory):
    return grading.grade_notebook(_copy("adv_importlib", tmp_path_factory), timeout=30)


@pytest.fixture(scope="module")
def crashes_grade(tmp_path_factory):
    return grading.grade_notebook(_copy("adv_crashes", tmp_path_factory), timeout=30)


@pytest.fixture(scope="module")
def loop_grade(tmp_path_factory):
    start = time.monotonic()
    grade = grading.grade_notebook(_copy("adv_c_loop", tmp_path_factory), timeout=5)
    return grade, time.monotonic() - start


@pytest.fixture(scope="module")
def bomb_grade(tmp_path_factory):
    path = _copy("adv_memory_bomb", tmp_path_factory)
    return grading.grade_notebook(path, timeout=30, memory_limit=2 << 30)


@pytest.fixture(scope="module")
def fork_grade(tmp_path_factory):
    """Graded by the command line, to see its stderr too; without the sandbox (in one,
    the child cannot write its pid where the test reads it, and dies with the sandbox:
    tests/test_grader_isolation.py), so that the unsandboxed kernel's process group is
    still killed."""
    import subprocess
    import sys

    path = _copy("adv_fork", tmp_path_factory)
    command = [
        sys.executable,
        "-m",
        "attention_course.grading.grade",
        str(path),
        "--json",
        "--no-sandbox",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    return done, path.parent / "forked_child.pid"


@pytest.mark.slow
def test_importlib_wrapper_scores_zero_absent_and_static(importlib_grade):
    task = _by_name(importlib_grade)[TASK1]
    assert task.score == 0 and not task.passed
    # in the sandbox the reference is a stub: every case that reached it raised
    assert task.reason.startswith(
        "calls attention_course.scaled_dot_product_attention, which is not available while "
        "grading: write it yourself"
    ), task.reason
    # and the static scan's note names the import by a computed name (a note: the reference
    # is absent in the sandbox, so the code is graded by what it reaches)
    assert any("importlib.import_module" in n for n in task.notes), task.notes
    assert importlib_grade.score == 2  # the other two tasks are the student's own


@pytest.mark.slow
def test_allow_builtins_turns_a_builtin_into_a_note(tmp_path):
    path = tmp_path / "adv_builtin_sdpa.ipynb"
    shutil.copy(FIXTURES / "adv_builtin_sdpa.ipynb.json", path)
    strict = _by_name(grading.grade_notebook(path, timeout=30))[TASK1]
    assert strict.score == 0 and "is the answer itself" in strict.reason
    lenient = _by_name(grading.grade_notebook(path, timeout=30, allow_builtins=True))[TASK1]
    assert lenient.score > 0  # what its checks give (this cheat is not even right)
    assert any("allowed by --allow-builtins" in n for n in lenient.notes), lenient.notes


@pytest.mark.slow
def test_a_crash_costs_only_what_depends_on_it(crashes_grade):
    tasks = _by_name(crashes_grade)
    # task 1 was solved before os._exit(1): it keeps its marks; so do the tasks after
    assert tasks[TASK1].passed and tasks[TASK1].score == 3
    assert tasks["predicted_variances"].passed
    # a kernel that dies in a task's check costs that task only
    which_bug = tasks["which_bug"]
    assert which_bug.score == 0
    assert which_bug.reason == (
        "not graded: the kernel died while running its check (exit status 3)"
    )
    died = [c for c in crashes_grade.cells if c.status == "died"]
    assert [c.id for c in died] == ["exit-cell", "segfault-cell"]
    assert "exit status 1" in died[0].error
    assert "SIGSEGV" in died[1].error
    assert "(exit-cell): the kernel died while running this cell" in crashes_grade.table()


@pytest.mark.slow
def test_a_loop_in_c_code_is_stopped_by_a_restart(loop_grade):
    grade, seconds = loop_grade
    (cell,) = [c for c in grade.cells if c.id == "c-loop"]
    assert cell.status == "died" and "could not be interrupted" in cell.error
    assert grade.passed and grade.score == 5
    assert seconds < 90


@pytest.mark.slow
def test_a_memory_bomb_fails_under_the_memory_limit(bomb_grade):
    tasks = _by_name(bomb_grade)
    assert tasks[TASK1].passed
    (cell,) = [c for c in bomb_grade.cells if c.id == "bomb"]
    assert cell.status == "error" and "memory" in cell.error.lower(), cell
    # the bomb was placed after task 2's solution cell: task 2 still passes
    assert tasks["which_bug"].passed and tasks["predicted_variances"].passed


@pytest.mark.slow
def test_a_forked_child_does_not_outlive_the_grade(fork_grade):
    done, pid_file = fork_grade
    grade = json.loads(done.stdout)
    assert done.returncode == 0 and grade["score"] == 5, done.stdout
    # the bare fork's child complains on the kernel's stderr: not on the grader's, where
    # only the --no-sandbox warning is
    assert done.stderr.startswith("NOT SANDBOXED") and len(done.stderr.splitlines()) == 1
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the forked child {pid} is still running")


@pytest.mark.slow
def test_grade_json_lists_findings(importlib_grade):
    document = json.loads(json.dumps(importlib_grade.to_dict()))
    task = next(t for t in document["tasks"] if t["name"] == TASK1)
    assert {f["kind"] for f in task["findings"]} == {"dynamic"}


def test_a_dead_cell_is_named_in_the_reasons_of_the_tasks_it_cost():
    runs = {5: grading.CellRun(5, "helpers", "died", "the kernel died (exit status 1)")}
    grade = grading.TaskGrade("t", "check", "t", 3, reason="case: raised NameError")
    grading._blame_dead_cells(grade, {5, 7}, [5], runs)
    assert grade.reason.splitlines()[1] == (
        "cell 5 (helpers), which this task needs, killed the kernel: "
        "the kernel died (exit status 1)"
    )
    other = grading.TaskGrade("u", "check", "u", 3, reason="case: wrong")
    grading._blame_dead_cells(other, {7}, [5], runs)  # does not need cell 5
    assert other.reason == "case: wrong"
    task = {"solution_cell": "t"}
    why = grading._why_missing(task, nbformat.v4.new_notebook(), {"t": 5}, runs)
    assert why == " (cell 5, which defines it, killed the kernel: the kernel died (exit status 1))"


SIG = "def scaled_dot_product_attention(query, key, value, mask=None, dropout_p=0.0, scale=None):"


@pytest.mark.parametrize(
    ("source", "kind", "what"),
    [
        (
            f"{SIG}\n    return getattr(ac, 'scaled_dot_product_attention')(query, key, value)",
            "reference",
            "attention_course.scaled_dot_product_attention",
        ),
        (
            f"import sys\n{SIG}\n    m = sys.modules['attention_' + 'course']\n    return m",
            "dynamic",
            "reads `sys.modules`",
        ),
        (f"{SIG}\n    return eval('ac.scaled_dot_product_attention')(query, key, value)", "", ""),
        (
            f"sdpa = torch.nn.functional.scaled_dot_product_attention\n{SIG}\n"
            "    return sdpa(query, key, value), None",
            "builtin",
            "torch.nn.functional.scaled_dot_product_attention",
        ),
        # sys and importlib reached as attributes of another module
        (
            f"{SIG}\n    m = F.importlib.import_module('attention_' + 'course')\n    return m",
            "dynamic",
            "imports a module by a name computed at run time",
        ),
        (
            f"{SIG}\n    m = torch.sys.modules['attention_' + 'course']\n    return m",
            "dynamic",
            "reads `sys.modules`",
        ),
        # a helper defined in another cell, called by the solution
        (f"{SIG}\n    return helper(query, key, value)", "reference", "attention_course.attention"),
    ],
)
def test_static_scan_spellings(source, kind, what):
    nb = nbformat.read(SOLVED, as_version=4)
    (cell,) = [c for c in nb.cells if c.get("id") == "task1-solution"]
    cell.source = source
    helper = "from attention_course import attention\n\n\ndef helper(q, k, v):\n"
    helper += "    return attention.scaled_dot_product_attention(q, k, v)"
    nb.cells.insert(4, nbformat.v4.new_code_cell(helper))
    findings = scan_notebook(nb, grading.find_tasks(nb))[TASK1]
    if not kind:  # eval: flagged as code the grader cannot follow
        assert [f.kind for f in findings] == ["dynamic"] and "eval" in findings[0].what
        return
    assert any(f.kind == kind and f.what.startswith(what) for f in findings), findings


def test_a_subclass_of_the_builtin_is_flagged():
    nb = nbformat.read(ROOT / "exercises" / "solutions" / "07_layernorm_batchnorm.ipynb", 4)
    (cell,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "LayerNorm"]
    cell.source = "class LayerNorm(nn.LayerNorm):\n    pass"
    findings = scan_notebook(nb, grading.find_tasks(nb))["LayerNorm"]
    assert [(f.kind, f.what) for f in findings] == [("builtin", "torch.nn.LayerNorm")]
