"""The grader draws the checks' inputs from a fresh seed for each run (issue 25, section 2).

A lookup-table submission (`tests/fixtures/make_lookup.py`: exercise 1, whose
``soft_argmax`` replays the reference's outputs on the check cell's inputs, recorded at
home) gets full marks in its check cell, and none in the grader, with the reason named:
the first case's inputs are not in its table. The run seed is recorded in the result's
JSON, the table and the feedback, and ``--seed`` with the recorded seed reproduces the run.
"""

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

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "adv_lookup_table.ipynb.json"


def _cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(argv)
    return status, out.getvalue(), err.getvalue()


def _cells(path: Path) -> dict:
    """The submission's code cells run in this process, check cells included, as a student
    runs the notebook; the namespace they leave."""
    from IPython.core.inputtransformer2 import TransformerManager

    nb = json.loads(path.read_text(encoding="utf-8"))
    namespace: dict = {"__name__": "__main__"}
    transform = TransformerManager().transform_cell
    with contextlib.redirect_stdout(io.StringIO()):
        for index, cell in enumerate(nb["cells"]):
            if cell["cell_type"] == "code":
                source = transform("".join(cell["source"]))
                exec(compile(source, f"cell {index}", "exec"), namespace)
    return namespace


def test_the_lookup_table_gets_full_marks_in_its_check_cell(monkeypatch):
    """Every check cell of the submission shows ✓ everywhere (its ``assert_passed()``
    raises otherwise): the table is faithful on the inputs it recorded, and only there."""
    pytest.importorskip("IPython")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    from attention_course.checks import check_soft_argmax

    namespace = _cells(FIXTURE)
    assert namespace["report"].passed  # the last check cell's report
    assert check_soft_argmax(namespace["soft_argmax"]).score == 1.0
    fresh = check_soft_argmax(namespace["soft_argmax"], seed=20261127)
    assert fresh.score == 0.0
    assert "KeyError" in fresh.results[0].message


def test_grade_refuses_seed_zero_the_check_cells_seed(tmp_path):
    path = tmp_path / "lookup.ipynb"
    shutil.copyfile(FIXTURE, path)
    status, _, err = _cli(["grade", str(path), "--seed", "0", "--no-sandbox"])
    assert status == 2 and "--seed must be >= 1" in err


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if isolation.bwrap() is None:  # pragma: no cover - CI installs bubblewrap
        pytest.skip("bubblewrap is not installed")
    base = tmp_path_factory.mktemp("seed")
    path = base / "lookup.ipynb"
    shutil.copyfile(FIXTURE, path)
    runs = []
    for extra in ([], None):  # a fresh seed, then the recorded one again
        out = base / f"out{len(runs)}"
        if extra is None:
            extra = ["--seed", str(runs[0]["json"]["seed"])]
        status, text, err = _cli(["grade", str(path), "--out", str(out), *extra])
        (result,) = out.glob("*.json")
        (feedback,) = out.glob("*.md")
        runs.append(
            {
                "status": status,
                "table": text,
                "json": json.loads(result.read_text(encoding="utf-8")),
                "feedback": feedback.read_text(encoding="utf-8"),
            }
        )
    return runs


def _tasks(run: dict) -> dict:
    return {t["name"]: t for t in run["json"]["tasks"]}


def test_the_lookup_table_gets_no_marks_in_the_grader(graded):
    run = graded[0]
    tasks = _tasks(run)
    faked = tasks["soft_argmax"]
    assert faked["score"] == 0 and not faked["passed"], faked
    # the reason names the first failing case: its inputs are not in the table
    assert faked["reason"].startswith("1-D scores: soft_argmax(scores) raised KeyError"), faked
    assert "TABLE[_key(scores, beta, dim)]" in faked["reason"]  # the student's line
    assert all(not r["passed"] for r in faked["report"]["results"])
    # the honest tasks of the same notebook keep their marks
    assert tasks["set_attention"]["score"] == tasks["set_attention"]["points"] == 2
    assert tasks["chosen_beta"]["score"] == tasks["chosen_beta"]["points"] == 1
    assert run["json"]["score"] == 3 and run["status"] == 1


def test_the_seed_is_recorded_and_reproduces_the_run(graded):
    fresh, again = graded
    seed = fresh["json"]["seed"]
    assert isinstance(seed, int) and seed >= 1
    assert f"inputs drawn with seed {seed} (reproduce: --seed {seed})" in fresh["table"]
    assert f"The checks drew their inputs with seed {seed}." in fresh["feedback"]
    assert again["json"]["seed"] == seed
    # the same inputs: the same keys missing from the table, word for word
    assert _tasks(again)["soft_argmax"]["reason"] == _tasks(fresh)["soft_argmax"]["reason"]
    assert [t["score"] for t in again["json"]["tasks"]] == [
        t["score"] for t in fresh["json"]["tasks"]
    ]
