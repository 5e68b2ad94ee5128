"""`attention-course grade` on a solved, an unsolved and a deliberately broken notebook.

Each grading starts a real kernel, so the three notebooks are graded once per module
(about 45 s in all on two CPU cores) and the tests below read the results.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from attention_course import cli  # noqa: E402
from attention_course.grading import grade as grading  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NAME = "06_multi_head_attention.ipynb"
SOLVED = ROOT / "exercises" / "solutions" / NAME
UNSOLVED = ROOT / "exercises" / NAME
# Made from the solved notebook: an endless loop cell after task 1, task 2's check cell
# deleted, task 3 forgets the output projection w_o, task 4's cell has a syntax error.
# Not named .ipynb, so that neither nbval nor ruff picks it up.
BROKEN = ROOT / "tests" / "fixtures" / "06_broken.ipynb.json"
TASKS = ["split_heads", "merge_heads", "MultiHeadAttention", "parameter_count"]


@pytest.fixture(scope="module")
def solved_run():
    return _cli(["grade", str(SOLVED)])


@pytest.fixture(scope="module")
def unsolved_run():
    return _cli(["grade", str(UNSOLVED), "--json"])


@pytest.fixture(scope="module")
def broken_grade():
    return grading.grade_notebook(BROKEN, timeout=10)


def _cli(argv):
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli.main(argv)
    return status, out.getvalue()


@pytest.mark.slow
def test_solved_notebook_scores_full_marks(solved_run):
    status, table = solved_run
    assert status == 0, table
    assert "total: 8/8" in table
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[2:6]}
    assert rows == {
        "split_heads": ["2/2", "100%"],
        "merge_heads": ["2/2", "100%"],
        "MultiHeadAttention": ["3/3", "100%"],
        "parameter_count": ["1/1", "100%"],
    }
    assert "cells that failed" not in table


@pytest.mark.slow
def test_unsolved_notebook_scores_zero_with_not_implemented_reasons(unsolved_run):
    status, text = unsolved_run
    assert status == 1
    document = json.loads(text)
    assert document["exercise"] == "06_multi_head_attention"
    assert (document["score"], document["max_score"], document["passed"]) == (0, 8, False)
    assert [t["name"] for t in document["tasks"]] == TASKS
    for task in document["tasks"]:
        assert task["score"] == 0 and not task["passed"]
        assert "not implemented" in task["reason"], task
    assert document["cell_problems"] == []  # the stubs run; only the checks fail


@pytest.mark.slow
def test_broken_notebook_is_graded_with_the_right_reasons(broken_grade):
    by_name = {t.name: t for t in broken_grade.tasks}
    assert list(by_name) == TASKS

    # the endless loop is interrupted and the tasks around it are still graded
    loop = [c for c in broken_grade.cells if c.id == "endless-loop"]
    assert loop[0].status == "timeout" and "time limit of 10 s" in loop[0].error
    assert by_name["split_heads"].passed and by_name["split_heads"].score == 2

    # a deleted check cell changes nothing: the grader runs the check itself
    assert by_name["merge_heads"].passed
    assert by_name["merge_heads"].notes == ["its check cell was deleted; graded anyway"]

    # a wrong implementation scores what its report says, with the first failing case
    mha = by_name["MultiHeadAttention"]
    assert not mha.passed and mha.score < 3 and mha.report is not None
    first = next(r for r in mha.report["results"] if not r["passed"])
    assert mha.reason == f"{first['name']}: {first['message'].strip()}"
    assert "output" in mha.reason
    # the whole message, not only its first line: the named mistake is in the reason
    assert len(mha.reason.splitlines()) > 1 and "Likely mistake" in mha.reason, mha.reason

    # a syntax error: not defined, and the reason names the cell and the error
    quiz = by_name["parameter_count"]
    assert quiz.score == 0 and quiz.report is None
    assert quiz.reason.startswith("`parameter_count` is not defined (cell ")
    assert "raised SyntaxError" in quiz.reason

    assert not broken_grade.passed
    assert broken_grade.score == 4 + mha.score
    problems = broken_grade.to_dict()["cell_problems"]
    assert [p["status"] for p in problems] == ["timeout", "error"]


@pytest.mark.slow
def test_table_and_json_agree(broken_grade):
    table = broken_grade.table()
    document = json.loads(json.dumps(broken_grade.to_dict()))
    # the diagnosis the student saw is in both: every line of the first failing message
    mha = next(t for t in document["tasks"] if t["name"] == "MultiHeadAttention")
    for line in mha["reason"].splitlines():
        assert line.split()[0] in table, line
    assert any("Likely mistake" in line for line in table.splitlines())
    assert f"total: {document['score']:g}/8" in table
    assert "merge_heads: its check cell was deleted; graded anyway" in table
    assert "(endless-loop): ran over the time limit" in table


@pytest.mark.slow
def test_missing_solution_cell_and_reference_import(tmp_path):
    nb = nbformat.read(UNSOLVED, as_version=4)
    # delete the cell that defines merge_heads; import the reference split_heads instead
    nb.cells = [c for c in nb.cells if c.get("id") != "task2-solution"]
    for cell in nb.cells:
        if cell.get("id") == "task1-solution":
            cell.source = "from attention_course import split_heads"
    path = tmp_path / NAME
    nbformat.write(nb, path)
    grade = grading.grade_notebook(path, timeout=30)
    split, merge = grade.tasks[:2]
    # in the sandbox the reference is a stub: the check runs, and every call refuses
    assert split.score == 0 and split.reason.startswith(
        "calls attention_course.split_heads, which is not available while grading"
    ), split.reason
    assert merge.score == 0
    assert merge.reason == (
        "`merge_heads` is not defined (the cell that defines it, 'merge_heads', was deleted)"
    )


# ---------------------------------------------------------------- no kernel needed


def test_tasks_fall_back_to_the_check_cells_without_metadata():
    nb = nbformat.read(SOLVED, as_version=4)
    expected = [
        {k: t[k] for k in ("kind", "name", "points")}
        for t in nb.metadata["attention_course"]["tasks"]
    ]
    del nb.metadata["attention_course"]
    found = grading.find_tasks(nb)
    assert [{k: t[k] for k in ("kind", "name", "points")} for t in found] == expected
    assert found[0]["checker"] == "check_split_heads"
    assert found[3]["question"] == "06.parameter_count"


@pytest.mark.slow
def test_unreadable_submission_exits_2(tmp_path, capsys):
    path = tmp_path / "not_a_notebook.ipynb"
    path.write_text("{ this is not json")
    assert grading.main([str(path)]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.slow
def test_notebook_without_tasks_exits_2(tmp_path, capsys):
    path = tmp_path / "empty.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), path)
    assert grading.main([str(path)]) == 2  # no exercise key, and no exercise called "empty"
    assert "cannot tell which exercise this is ('empty'" in capsys.readouterr().err
    assert grading.main([str(path), "--trust-notebook"]) == 2
    assert "lists no exercise tasks" in capsys.readouterr().err


def test_table_shows_the_whole_first_failing_message_wrapped():
    diagnosis = (
        "Likely mistake: eval mode still uses the batch statistics of the input instead of "
        "the running statistics collected in training."
    )
    reason = (
        "eval-mode output: wrong values (largest error 0.4 at [0, 1])\n"
        "row [0, :]: expected [0.1, 0.2]\n"
        "            got      [0.5, 0.6]\n" + diagnosis
    )
    tasks = [
        grading.TaskGrade("bn", "check", "BatchNorm1d", 3, score=1.5, fraction=0.5, reason=reason),
        grading.TaskGrade("q", "quiz", "parameter_count", 1, score=1, fraction=1, passed=True),
    ]
    table = grading.Grade("nb.ipynb", "07", tasks, [], 60).table(width=80).splitlines()
    assert table[1].split()[-6:] == ["first", "failing", "case", "and", "its", "message"]
    column = table[1].index("first failing")
    assert table[2].startswith("BatchNorm1d") and table[2][column:].startswith("eval-mode")
    below = table[3:8]
    assert all(len(line) <= 80 and line[:column].strip() == "" for line in below), below
    # the aligned "got" row keeps its alignment under "expected"
    assert below[1].index("got") == below[0].index("expected")
    # the named mistake is shown in full, wrapped over lines
    assert " ".join(line.strip() for line in below[2:]) == diagnosis
    assert table[8].startswith("parameter_count") and table[9] == "total: 2.5/4"
