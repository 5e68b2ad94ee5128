"""`attention-course grade FOLDER --jobs 2 --csv --junit` end to end, on four submissions:
a solved and an unsolved exercise 4, the broken exercise 6 (a named mistake), and a
file that is not a notebook. One run (two kernels at a time, about a minute)."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("class")
    shutil.copy(ROOT / "exercises/solutions/04_scaled_dot_product.ipynb", folder / "ada.ipynb")
    shutil.copy(ROOT / "exercises/04_scaled_dot_product.ipynb", folder / "bob.ipynb")
    (folder / "sub").mkdir()
    shutil.copy(ROOT / "tests/fixtures/06_broken.ipynb.json", folder / "sub" / "cy.ipynb")
    shutil.copy(ROOT / "tests/fixtures/adv_not_a_notebook.ipynb.json", folder / "dee.ipynb")
    out = tmp_path_factory.mktemp("out")
    command = [
        sys.executable,
        "-m",
        "attention_course.cli",
        "grade",
        str(folder),
        "--jobs",
        "2",
        "--timeout",
        "10",
        "--csv",
        str(out / "grades.csv"),
        "--junit",
        str(out / "grades.xml"),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=500)
    return done, out, folder


@pytest.mark.slow
def test_folder_gradebook(folder_run):
    done, out, folder = folder_run
    assert done.returncode == 2, done.stderr  # one submission could not be read
    rows = list(csv.DictReader((out / "grades.csv").open(encoding="utf-8")))
    by_file = {Path(r["file"]).name: r for r in rows}
    assert list(by_file) == ["ada.ipynb", "bob.ipynb", "dee.ipynb", "cy.ipynb"]
    assert (by_file["ada.ipynb"]["total"], by_file["ada.ipynb"]["max"]) == ("5", "5")
    assert by_file["ada.ipynb"]["04_scaled_dot_product/scaled_dot_product_attention"] == "3"
    assert by_file["bob.ipynb"]["total"] == "0"
    assert "cannot read" in by_file["dee.ipynb"]["error"]
    assert by_file["cy.ipynb"]["06_multi_head_attention/split_heads"] == "2"


@pytest.mark.slow
def test_junit_has_a_case_per_task_with_the_reason(folder_run):
    _, out, _ = folder_run
    root = ET.parse(out / "grades.xml").getroot()
    suites = {Path(s.get("name")).name: s for s in root}
    ada = suites["ada.ipynb"]
    assert [c.get("name") for c in ada] == [
        "scaled_dot_product_attention",
        "which_bug",
        "predicted_variances",
    ]
    assert ada.get("failures") == "0"
    bob = suites["bob.ipynb"]
    failure = bob.find("testcase/failure")
    assert "not implemented" in failure.get("message")
    assert suites["dee.ipynb"].find("testcase/error") is not None


@pytest.mark.slow
def test_summary_names_the_common_mistakes(folder_run):
    done, _, _ = folder_run
    text = done.stdout
    assert "4 submissions, 3 graded, 1 could not be read" in text
    # two exercises: each task is named with its exercise
    assert "04_scaled_dot_product/scaled_dot_product_attention: mean 1.5/3, passed 1/2" in text
    lines = text.splitlines()
    at = next(
        i
        for i, line in enumerate(lines)
        if line.startswith("  06_multi_head_attention/MultiHeadAttention: mean")
    )
    mistakes = [line for line in lines[at + 1 :] if line.startswith("      ")]
    # the broken notebook's named mistake (its "Likely mistake:" line), counted once
    assert mistakes and mistakes[0].startswith("      1 x "), lines[at:]


@pytest.mark.slow
def test_no_stray_kernel_warnings(folder_run):
    done, _, _ = folder_run
    assert "without encryption" not in done.stderr
    assert "grading" in done.stderr  # the progress bar


# ---------------------------------------------------------------- tiered hints, no kernel


def test_hints_in_three_tiers():
    from attention_course.checks import REGISTRY, check_scaled_dot_product_attention
    from attention_course.checks._hints import CONCEPTS

    assert {c.target for c in REGISTRY} <= set(CONCEPTS)  # a concept for every checker

    def unscaled(query, key, value, mask=None, dropout_p=0.0, scale=None):
        weights = (query @ key.transpose(-2, -1)).softmax(dim=-1)
        return weights @ value, weights

    report = check_scaled_dot_product_attention(unscaled)
    assert "1/sqrt(d_k) scale" in report.hint(1)
    assert "book/04_scaled_dot_product.ipynb" in report.hint(2)
    third = report.hint(3)
    assert "defaults to 1 / sqrt(d_k)" in third and "Likely mistake:" in third

    with pytest.raises(ValueError, match="expected 1, 2 or 3"):
        report.hint(4)


def test_gradebook_outputs_without_a_kernel():
    import io

    from attention_course.grading import grade as grading
    from attention_course.grading import gradebook

    def task(score, reason=""):
        return grading.TaskGrade(
            "parameter_count", "quiz", "parameter_count", 1, score, score, score == 1, reason
        )

    entries = [
        gradebook.Entry(Path("a"), grading.Grade("a", "06", [task(1)], [], 60)),
        gradebook.Entry(
            Path("b"), grading.Grade("b", "08", [task(0, "x\nLikely mistake: no biases.")], [], 60)
        ),
        gradebook.Entry(Path("c"), error="cannot read c"),
    ]
    out = io.StringIO()
    gradebook.write_csv(entries, out)
    # two exercises with a task of the same name: one column each
    assert out.getvalue().splitlines() == [
        "student,file,exercise,total,max,06/parameter_count,08/parameter_count,error",
        "a,a,06,1,1,1,,",
        "b,b,08,0,1,,0,",
        "c,c,,0,,,,cannot read c",
    ]
    rows = gradebook.summary(entries)
    assert rows[1]["common_mistakes"] == [{"mistake": "no biases.", "count": 1}]
    root = ET.fromstring(gradebook.junit_xml(entries).split("?>", 1)[1])
    assert root[1][0].find("failure").get("message") == "x"
    assert root[2].get("errors") == "1"
