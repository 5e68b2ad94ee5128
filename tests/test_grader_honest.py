"""Honest but unusual solutions get full marks in the sandboxed grader: einsum, a helper
in another cell, numpy inside, a class with extra methods, a given building block
imported by its module path (`tests/fixtures/make_honest.py`). One class run of five
(about two minutes on two CPU cores, ``--jobs 2``)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from attention_course import cli  # noqa: E402
from attention_course.grading import isolation  # noqa: E402

if isolation.bwrap() is None:  # pragma: no cover - CI installs bubblewrap
    pytest.skip("bubblewrap is not installed", allow_module_level=True)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
HONEST = {
    "honest_einsum": 5,
    "honest_helper_cells": 5,
    "honest_numpy": 5,
    "honest_extra_methods": 8,
    "honest_module_path": 7,
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    klass = tmp_path_factory.mktemp("honest")
    for name in HONEST:
        shutil.copyfile(FIXTURES / f"{name}.ipynb.json", klass / f"{name}.ipynb")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli.main(["grade", str(klass), "--jobs", "2", "--json", "--no-progress"])
    document = json.loads(out.getvalue())
    return status, {Path(s["notebook"]).stem: s for s in document["submissions"]}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(HONEST))
def test_an_unusual_honest_solution_gets_full_marks(graded, name):
    status, grades = graded
    grade = grades[name]
    # A notebook that could not be graded has no score: show why (a CI run under heavy load
    # once failed here with only "KeyError: 'score'").
    assert "score" in grade, f"{name} was not graded: {grade}"
    assert (grade["score"], grade["max_score"]) == (HONEST[name], HONEST[name]), grade
    assert all(not t["findings"] for t in grade["tasks"]), grade
    assert grade["cell_problems"] == [] and grade["sandboxed"] is True


def test_a_given_block_by_its_module_path_is_no_finding():
    """Exercise 10 gives MultiHeadAttention: `from attention_course.multihead import
    MultiHeadAttention as MHA` is that block (it scored 1/7 as "calls the reference");
    the task's own target by its module path still is the reference."""
    import nbformat

    from attention_course.grading import cheats
    from attention_course.grading import grade as grading
    from attention_course.grading.release import released_given

    nb = nbformat.reads((FIXTURES / "honest_module_path.ipynb.json").read_text(), 4)
    _, tasks, _ = grading.tasks_to_grade(nb, "10_transformer.ipynb")
    given = released_given()["10_transformer"]
    assert cheats.scan_notebook(nb, tasks, given) == {}
    for cell in nb.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "DecoderLayer":
            cell.source = (
                "from attention_course.transformer import DecoderLayer as Mine\n\n\n"
                + cell.source.replace("class DecoderLayer(", "class _Unused(")
                + "\n\nDecoderLayer = Mine\n"
            )
    findings = cheats.scan_notebook(nb, tasks, given)
    assert list(findings) == ["DecoderLayer"]
    assert findings["DecoderLayer"][0].what == "attention_course.transformer.DecoderLayer"
