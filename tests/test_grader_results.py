"""Nothing lost: each submission's result written as soon as it is graded, ``--resume``,
the ``gradebook`` merge, the student column, feedback files, skipped files listed, the
expected exercise, and a summary that counts every named diagnosis and time-outs apart.

Most tests build grades without a kernel; one grades a class of two in a subprocess
that is killed after the first result is written (about a minute on two CPU cores).
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest

from attention_course import cli
from attention_course.grading import grade as grading
from attention_course.grading import gradebook

ROOT = Path(__file__).resolve().parents[1]
SOLVED = ROOT / "exercises" / "solutions" / "05_masking.ipynb"


def _task(name, score, points=1, reason="", report=None, kind="check"):
    return grading.TaskGrade(
        name, kind, name, points, score, score / points, score == points, reason, [], report
    )


def _report(*messages):
    return {
        "target": "check_causal_mask",
        "passed": False,
        "score": 0.0,
        "results": [
            {"name": f"case {i}", "passed": False, "message": m, "weight": 1.0}
            for i, m in enumerate(messages)
        ],
    }


def _entry(path, *tasks, student=""):
    grade = grading.Grade(str(path), "05_masking", list(tasks), [], 60)
    return gradebook.Entry(Path(path), grade, student=student)


def test_a_result_round_trips_through_its_json(tmp_path):
    notebook = tmp_path / "ada.ipynb"
    notebook.write_text("{}")
    entry = _entry(notebook, _task("causal_mask", 0, 2, "x\nHint: tril", _report("x\nHint: tril")))
    entry.digest = gradebook.digest(notebook)
    results = gradebook.Results(tmp_path / "out")
    written = results.write(entry)
    again = gradebook.Entry.from_dict(json.loads(written.read_text()))
    assert again.grade.table() == entry.grade.table()
    assert again.student == "ada"
    assert results.done(notebook) is not None
    notebook.write_text('{"changed": 1}')  # a new submission of the same file: graded again
    assert results.done(notebook) is None
    feedback = written.with_suffix(".md").read_text()
    assert "# 05_masking: ada" in feedback and "0 / 2" in feedback
    assert "Hint: tril" in feedback  # the diagnosis
    assert "\nHint: " in feedback.split("```")[-1]  # and the first-tier hint after it


def test_summary_counts_every_named_diagnosis_and_time_outs_apart():
    limit = "ran over the time limit of 10 s: look for an endless loop"
    entries = [
        _entry("a", _task("causal_mask", 0, 2, "", _report("w\nLikely mistake: triu"))),
        _entry("b", _task("causal_mask", 0, 2, "", _report("w\nHint: use tril"))),
        _entry("c", _task("causal_mask", 0, 2, "`causal_mask` is not defined (cell 5, x)")),
        _entry("d", _task("causal_mask", 0, 2, "", _report(limit))),
        _entry("e", _task("causal_mask", 2, 2)),
    ]
    row = gradebook.summary(entries, top=10)[0]
    assert row["named_mistakes"] == 3
    assert {m["mistake"] for m in row["common_mistakes"]} == {
        "triu",
        "use tril",
        "`causal_mask` is not defined",
    }
    assert row["timeouts"] == 1
    assert "time-outs: 1 submission(s)" in gradebook.summary_text(entries)


def test_other_files_are_listed_and_upper_case_notebooks_graded(tmp_path):
    for name in ("a.ipynb", "B.IPYNB", "notes.txt", "c.ipynb.txt", ".hidden"):
        (tmp_path / name).write_text("{}")
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".ipynb_checkpoints" / "a-checkpoint.ipynb").write_text("{}")
    notebooks, skipped = gradebook.find_files([tmp_path])
    assert [p.name for p in notebooks] == ["B.IPYNB", "a.ipynb"]
    assert [p.name for p in skipped] == ["c.ipynb.txt", "notes.txt"]


def test_another_exercise_is_reported_not_graded(tmp_path):
    path = tmp_path / "ada.ipynb"
    shutil.copyfile(SOLVED, path)
    args = Namespace(exercise="06", trust_notebook=False)
    entry = grading._grade_entry(path, args)
    assert entry.grade is None
    assert "is exercise 05_masking, not the expected 06: not graded" in entry.error


def test_gradebook_merges_result_folders_with_a_student_column(tmp_path):
    roster_names = {"s1.ipynb": "Ada Lovelace", "s2.ipynb": "Alan Turing"}
    for index, (name, student) in enumerate(roster_names.items()):
        results = gradebook.Results(tmp_path / f"machine{index}")
        task = _task("causal_mask", 2 * index, 2, "" if index else "x")
        results.write(_entry(tmp_path / name, task, student=student))
    gradebook.Results(tmp_path / "machine2").write(
        gradebook.Entry(tmp_path / "s3.txt", error="skipped: s3.txt is not a notebook")
    )
    out = io.StringIO()
    folders = [str(tmp_path / f"machine{i}") for i in range(3)]
    csv_path = tmp_path / "grades.csv"
    import contextlib

    with contextlib.redirect_stdout(out):
        status = cli.main(["gradebook", *folders, "--csv", str(csv_path)])
    assert status == 1  # one lost points; a skipped file is not an error
    rows = list(csv.DictReader(csv_path.open(encoding="utf-8")))
    assert [(r["student"], r["total"]) for r in rows] == [
        ("Ada Lovelace", "0"),
        ("Alan Turing", "2"),
        ("s3", "0"),
    ]
    assert rows[2]["error"].startswith("skipped:")
    assert "2 submissions, 2 graded; 1 other files skipped" in out.getvalue()


@pytest.mark.slow
def test_a_killed_run_loses_nothing_and_resume_finishes_it(tmp_path):
    klass, out = tmp_path / "class", tmp_path / "out"
    klass.mkdir()
    for name in ("ada", "bob"):
        shutil.copyfile(SOLVED, klass / f"{name}.ipynb")
    roster = tmp_path / "roster.csv"  # not in the class folder: it would be listed as skipped
    roster.write_text("file,student\nada.ipynb,Ada L\nbob.ipynb,Bob M\n")
    command = [
        sys.executable,
        "-m",
        "attention_course.cli",
        "grade",
        str(klass),
        "--out",
        str(out),
        "--roster",
        str(roster),
        "--no-progress",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.monotonic() + 300
    while not list(out.glob("*.json")) and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.2)
    os.killpg(run.pid, signal.SIGKILL)  # the grader dies after the first result
    run.wait()
    first = list(out.glob("*.json"))
    assert len(first) == 1, run.stderr.read()
    kept = json.loads(first[0].read_text())
    assert kept["student"] in ("Ada L", "Bob M") and kept["score"] == 5
    assert not list(out.glob("*.partial"))

    done = subprocess.run(
        [*command, "--resume", "--csv", str(tmp_path / "grades.csv"), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert first[0].read_text() == json.dumps(kept, indent=1, ensure_ascii=False) + "\n"
    rows = list(csv.DictReader((tmp_path / "grades.csv").open(encoding="utf-8")))
    assert sorted((r["student"], r["total"]) for r in rows) == [("Ada L", "5"), ("Bob M", "5")]
    assert len(list(out.glob("*.json"))) == 2 and len(list(out.glob("*.md"))) == 2


@pytest.mark.parametrize("flag", ["--resume"])
def test_resume_skips_a_graded_file_without_a_kernel(tmp_path, monkeypatch, flag):
    path = tmp_path / "ada.ipynb"
    shutil.copyfile(SOLVED, path)
    results = gradebook.Results(tmp_path / "out")
    entry = _entry(path, _task("causal_mask", 2, 2))
    entry.digest = gradebook.digest(path)
    results.write(entry)

    def no_kernel(*args, **kwargs):
        raise AssertionError("graded again")

    monkeypatch.setattr(grading, "grade_notebook", no_kernel)
    args = Namespace(exercise=None, trust_notebook=False, resume=True)
    again = grading._grade_student(path, args, {}, results)
    assert again.grade.score == 2
