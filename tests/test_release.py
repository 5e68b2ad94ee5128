"""`attention-course release`: the solution-stripping transform and the committed copies.

Nothing here starts a kernel: the committed student notebooks are compared with what the
generator makes from their solved twins on sources and metadata (outputs are checked by
`pytest --nbval` and `attention-course release --check`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook  # noqa: E402

from attention_course.checks import REGISTRY  # noqa: E402
from attention_course.grading.release import (  # noqa: E402
    ReleaseError,
    differences,
    make_student_notebook,
    strip_solution,
    student_path,
)

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "exercises" / "solutions").glob("[0-9]*.ipynb"))

SOLVED_FUNCTION = '''\
def soft_argmax(scores, beta=1.0, dim=-1):
    """Softmax of beta * scores."""
    ### BEGIN SOLUTION
    z = beta * scores
    return torch.softmax(z, dim=dim)
    ### END SOLUTION'''


def test_solution_block_becomes_raise_at_the_marker_indentation():
    assert strip_solution(SOLVED_FUNCTION) == (
        'def soft_argmax(scores, beta=1.0, dim=-1):\n    """Softmax of beta * scores."""\n'
        "    raise NotImplementedError"
    )


def test_lines_outside_blocks_are_kept_and_every_block_is_replaced():
    source = (
        "class M(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        ### BEGIN SOLUTION\n"
        "        self.linear = nn.Linear(2, 2)\n"
        "        ### END SOLUTION\n"
        "\n"
        "    def forward(self, x):\n"
        "        ### BEGIN SOLUTION\n"
        "        return self.linear(x)\n"
        "        ### END SOLUTION\n"
        "\n"
        "print('kept')\n"
    )
    assert strip_solution(source) == (
        "class M(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        raise NotImplementedError\n"
        "\n"
        "    def forward(self, x):\n"
        "        raise NotImplementedError\n"
        "\n"
        "print('kept')\n"
    )


def test_source_without_markers_is_unchanged():
    source = "import torch\nx = torch.ones(2)  # ### not a marker\n"
    assert strip_solution(source) == source


@pytest.mark.parametrize(
    "source, problem",
    [
        ("### BEGIN SOLUTION\nx = 1\n", "never closed"),
        ("x = 1\n### END SOLUTION\n", "without"),
        ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n", "nested"),
    ],
)
def test_broken_markers_are_reported(source, problem):
    with pytest.raises(ReleaseError, match=problem):
        strip_solution(source, where="cell 3")


def _solved_notebook():
    nb = new_notebook(
        cells=[
            new_markdown_cell("# Exercises 0: a test"),
            new_markdown_cell("> solutions only", metadata={"tags": ["solution-only"]}),
            new_markdown_cell("Why?\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION"),
            new_code_cell(SOLVED_FUNCTION, execution_count=3),
            new_code_cell("report = check_soft_argmax(soft_argmax)", execution_count=4),
        ],
        metadata={"attention_course": {"exercise": "00_test", "solutions": True, "tasks": []}},
    )
    nb.cells[3].outputs = [nbformat.v4.new_output("stream", text="solved\n")]
    return nb


def test_student_notebook_from_a_solved_one():
    solved = _solved_notebook()
    student = make_student_notebook(solved)

    assert [c.source for c in student.cells] == [
        "# Exercises 0: a test",
        "Why?\n*Your answer here.*",
        strip_solution(SOLVED_FUNCTION),
        "report = check_soft_argmax(soft_argmax)",
    ]
    assert all(c.outputs == [] and c.execution_count is None for c in student.cells[2:])
    assert [c.id for c in student.cells] == [solved.cells[i].id for i in (0, 2, 3, 4)]
    assert student.metadata["attention_course"]["solutions"] is False
    assert student.metadata["kernelspec"]["name"] == "python3"
    # the solved notebook itself is untouched
    assert "### BEGIN SOLUTION" in solved.cells[3].source
    assert solved.metadata["attention_course"]["solutions"] is True


def test_differences_ignore_execution_counts_ids_and_tracebacks():
    a = make_student_notebook(_solved_notebook())
    b = make_student_notebook(_solved_notebook())
    error = {"ename": "AssertionError", "evalue": "failed"}
    a.cells[3].outputs = [nbformat.v4.new_output("error", **error, traceback=["/home/a/x.py"])]
    b.cells[3].outputs = [nbformat.v4.new_output("error", **error, traceback=["/home/b/y.py"])]
    a.cells[3].execution_count, b.cells[3].execution_count = 1, 7
    for cell in b.cells:
        cell.id = "other-" + cell.id
    assert differences(a, b) == []

    b.cells[2].source += "\n# edited"
    b.cells[3].outputs[0]["evalue"] = "passed"
    assert differences(a, b) == ["cell 2: the source differs", "cell 3: the outputs differ"]
    assert differences(a, b, outputs=False) == ["cell 2: the source differs"]


def test_student_path():
    assert student_path(Path("exercises/solutions/05_masking.ipynb")) == Path(
        "exercises/05_masking.ipynb"
    )


def test_there_is_a_solved_twin_for_every_chapter():
    assert len(SOLUTIONS) == 23  # chapters 1-23
    assert sorted(p.name for p in (ROOT / "exercises").glob("[0-9]*.ipynb")) == [
        p.name for p in SOLUTIONS
    ]


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_committed_student_copy_matches_the_generator(solution):
    expected = make_student_notebook(nbformat.read(solution, as_version=4))
    committed = nbformat.read(student_path(solution), as_version=4)
    assert differences(expected, committed, outputs=False) == [], (
        f"{student_path(solution).name} is out of date: run `attention-course release "
        f"{solution.relative_to(ROOT)}`"
    )
    assert not any(has_marker(c.source) for c in committed.cells), "a solution leaked"


def has_marker(source: str) -> bool:
    return bool(re.search(r"###\s*(BEGIN|END) SOLUTION", source))


ALL_CHECKERS = {c.check.__name__ for c in REGISTRY if c.exercise}


def test_notebooks_cover_every_checker_and_have_a_quiz_each():
    used = set()
    for solution in SOLUTIONS:
        nb = nbformat.read(solution, as_version=4)
        tasks = nb.metadata["attention_course"]["tasks"]
        # at most 6: exercise 13 has its two implementations of chapter 13, the generation
        # loop with a cache, and three short questions (issue 24)
        assert 2 <= len(tasks) <= 6, solution.name
        assert any(t["kind"] == "quiz" for t in tasks), f"{solution.name} has no quiz task"
        used |= {t["checker"] for t in tasks if t["kind"] == "check"}
    assert used == ALL_CHECKERS


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_nbgrader_metadata(solution):
    nb = nbformat.read(solution, as_version=4)
    grade_ids = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader")
        if meta is None:
            continue
        grade_ids.append(meta["grade_id"])
        assert meta["schema_version"] == 3
        if meta["solution"]:
            assert meta == {**meta, "grade": False, "locked": False}
            assert "### BEGIN SOLUTION" in cell.source
        else:
            assert meta["grade"] and meta["locked"] and meta["points"] > 0
            assert "raises-exception" in cell.metadata.get("tags", [])
            assert cell.source.endswith("report.assert_passed()")
    assert len(grade_ids) == len(set(grade_ids)), "grade_id must be unique"
    for task in nb.metadata["attention_course"]["tasks"]:
        assert {task["solution_cell"], task["check_cell"]} <= set(grade_ids)


def test_check_names_a_stale_released_task_list(tmp_path):
    """`release --check` fails when exercise_tasks.json no longer matches a solved twin."""
    import json
    import shutil

    from attention_course.grading import release as release_module

    solution = SOLUTIONS[3]  # 04_scaled_dot_product
    released = json.loads(release_module.tasks_path().read_text(encoding="utf-8"))
    assert release_module.release(solution, check=True, execute=False) == []

    # a copy of the repository's layout whose task list is stale
    (tmp_path / "exercises" / "solutions").mkdir(parents=True)
    (tmp_path / "attention_course").mkdir()
    (tmp_path / "attention_course" / "__init__.py").write_text("")
    copy = tmp_path / "exercises" / "solutions" / solution.name
    shutil.copy(solution, copy)
    shutil.copy(solution.parent.parent / solution.name, tmp_path / "exercises" / solution.name)
    shutil.copy(release_module.given_path(), tmp_path / "attention_course")
    stale = dict(released)
    stale[solution.stem] = [dict(t, points=t["points"] + 1) for t in released[solution.stem]]
    (tmp_path / "attention_course" / "exercise_tasks.json").write_text(
        json.dumps(stale), encoding="utf-8"
    )
    assert release_module.release(copy, check=True, execute=False) == [release_module.TASKS_NOTE]


def test_release_writes_the_repositorys_records_not_the_installed_packages(tmp_path):
    """An authoring command acts on the repository that holds the solved twin."""
    import json
    import shutil

    from attention_course.grading import release as release_module

    solution = SOLUTIONS[3]
    installed = release_module.tasks_path().read_bytes()
    (tmp_path / "exercises" / "solutions").mkdir(parents=True)
    copy = tmp_path / "exercises" / "solutions" / solution.name
    shutil.copy(solution, copy)
    with pytest.raises(release_module.ReleaseError, match="repository's attention_course/"):
        release_module.release(copy, execute=False)
    (tmp_path / "attention_course").mkdir()
    (tmp_path / "attention_course" / "__init__.py").write_text("")
    release_module.release(copy, execute=False)
    written = json.loads((tmp_path / "attention_course" / "exercise_tasks.json").read_text())
    assert list(written) == [solution.stem]
    assert (tmp_path / "attention_course" / "exercise_given.json").exists()
    assert (tmp_path / "exercises" / solution.name).exists()  # the student copy
    assert release_module.tasks_path().read_bytes() == installed
