"""The grader's sandbox (bubblewrap): a class of exercise-5 submissions where some attack
their classmates, the repository and the grader (`tests/fixtures/make_isolation.py`).

One class run (about two minutes on two CPU cores, ``--jobs 2``); the tests read it.
Every attack must end with no effect on any other submission or on the grader's outputs,
and with its reason named in the attacker's own grade.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from attention_course import cli  # noqa: E402
from attention_course.grading import isolation  # noqa: E402

if isolation.bwrap() is None:  # pragma: no cover - CI installs bubblewrap
    pytest.skip("bubblewrap is not installed", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
SOLVED = ROOT / "exercises" / "solutions" / "05_masking.ipynb"
ATTACKS = ["iso_torch_py", "iso_edit_classmates", "iso_daemon", "iso_kill_parent", "iso_read_twin"]
HONEST = ["alice", "bob"]


def _digest(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file()
    }


def _cli(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli.main(argv)
    return status, out.getvalue()


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    base = tmp_path_factory.mktemp("isolation")
    klass, out = base / "class", base / "out"
    klass.mkdir()
    out.mkdir()
    for name in HONEST:
        shutil.copyfile(SOLVED, klass / f"{name}.ipynb")
    for name in ATTACKS:
        text = (FIXTURES / f"{name}.ipynb.json").read_text(encoding="utf-8")
        text = text.replace("@CLASS@", str(klass)).replace("@REPO@", str(ROOT))
        (klass / f"{name}.ipynb").write_text(text.replace("@OUT@", str(out)), encoding="utf-8")
    before = _digest(klass)
    status, text = _cli(
        [
            "grade",
            str(klass),
            "--jobs",
            "2",
            "--json",
            "--no-progress",
            "--csv",
            str(out / "grades.csv"),
            "--junit",
            str(out / "junit.xml"),
        ]
    )
    document = json.loads(text)
    grades = {Path(s["notebook"]).stem: s for s in document["submissions"]}
    return {
        "status": status,
        "grades": grades,
        "before": before,
        "after": _digest(klass),
        "out": out,
        "class": klass,
    }


def _cell_problems(grade: dict) -> str:
    return "\n".join(c["error"] for c in grade["cell_problems"])


@pytest.mark.slow
def test_the_sandbox_holds():
    report = isolation.check([ROOT / "exercises", ROOT / "README.md", ROOT / "tests"])
    assert report["uid"] == isolation.SANDBOX_UID
    assert report["interfaces"] == ["lo"] and not report["network"]
    assert report["visible"] == [] and not report["system_writable"]
    assert report["processes"] == [1, 2]  # its init and itself: not the grader
    assert report["nproc"] == [isolation.DEFAULT_PROCESSES] * 2


@pytest.mark.slow
def test_class_folder_and_outputs_untouched(graded_class):
    assert graded_class["after"] == graded_class["before"]  # no file added, none changed
    rows = list(csv.reader((graded_class["out"] / "grades.csv").open(encoding="utf-8")))
    assert len(rows) == 1 + len(HONEST) + len(ATTACKS)
    assert not any("iso_daemon,05_masking,5,5" in ",".join(r) for r in rows)
    assert (graded_class["out"] / "junit.xml").read_text().count("<testsuite ") == 7


@pytest.mark.slow
def test_honest_submissions_get_full_marks(graded_class):
    for name in HONEST:
        grade = graded_class["grades"][name]
        assert (grade["score"], grade["max_score"]) == (5, 5), grade
        assert grade["sandboxed"] is True


@pytest.mark.slow
def test_torch_py_beside_itself_harms_nobody_and_is_named(graded_class):
    grade = graded_class["grades"]["iso_torch_py"]
    assert grade["score"] == 5  # its own tasks are its own: a torch.py in its scratch
    assert "No such file or directory" in _cell_problems(grade)
    assert "torch.py" in _cell_problems(grade)


@pytest.mark.slow
def test_editing_classmates_reaches_nothing_and_is_named(graded_class):
    grade = graded_class["grades"]["iso_edit_classmates"]
    assert "FileNotFoundError" in _cell_problems(grade)
    assert str(graded_class["class"]) in _cell_problems(grade)


@pytest.mark.slow
def test_daemon_dies_with_the_sandbox_and_is_named(graded_class):
    grade = graded_class["grades"]["iso_daemon"]
    assert any("the sandbox ended them" in note for note in grade["notes"]), grade["notes"]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        assert comm != "ac-iso-daemon", f"the daemon {pid} outlived its grade"


@pytest.mark.slow
def test_signalling_the_grader_kills_only_its_own_kernel(graded_class):
    grade = graded_class["grades"]["iso_kill_parent"]
    assert graded_class["grades"].keys() == set(HONEST + ATTACKS)  # the run finished
    assert "the kernel died while running this cell (SIGKILL" in _cell_problems(grade)


@pytest.mark.slow
def test_reading_the_solved_twin_finds_nothing(graded_class):
    grade = graded_class["grades"]["iso_read_twin"]
    task = next(t for t in grade["tasks"] if t["name"] == "causal_mask")
    assert task["score"] == 0
    assert "is not defined" in task["reason"] and "FileNotFoundError" in task["reason"]
    assert "exercises/solutions/05_masking.ipynb" in task["reason"]


def test_grader_refuses_without_a_sandbox(monkeypatch, capsys):
    monkeypatch.setattr(isolation, "_CHECKED", {})
    monkeypatch.setattr(isolation, "bwrap", lambda: None)
    status = cli.main(["grade", str(SOLVED)])
    assert status == 2
    err = capsys.readouterr().err
    assert "refusing to grade for credit without a sandbox" in err
    assert "apt-get install -y bubblewrap" in err


@pytest.mark.slow
def test_no_sandbox_says_so_on_every_line(monkeypatch):
    monkeypatch.setattr(isolation, "bwrap", lambda: None)  # not needed, not used
    status, text = _cli(["grade", str(SOLVED), "--no-sandbox"])
    assert status == 0, text
    lines = text.rstrip("\n").split("\n")
    assert len(lines) > 4
    assert all(line.startswith(isolation.NO_SANDBOX_WARNING) for line in lines), text
    assert any("total: 5/5" in line for line in lines)


def test_a_python_environment_under_tmp_shows_through_the_sandboxes_tmp(monkeypatch):
    """CI's venv lives in `mktemp -d` (under /tmp): the sandbox's own /tmp must be mounted
    before the read-only binds, or it hides the venv and bwrap cannot find the kernel's Python
    (every grading test failed that way on a fresh CI clone)."""
    monkeypatch.setattr(isolation, "bwrap", lambda: "/usr/bin/bwrap")
    monkeypatch.setattr(
        isolation, "_read_only_paths", lambda: [("/tmp/ci/venv", "/tmp/ci/venv"), ("/usr", "/usr")]
    )
    scratch = isolation.Scratch()
    try:
        args = isolation.command(["python"], scratch)
    finally:
        scratch.remove()
    pairs = list(zip(args, args[1:], args[2:]))
    tmp_at = next(i for i, p in enumerate(pairs) if p[0] == "--bind" and p[2] == "/tmp")
    venv_at = next(i for i, p in enumerate(pairs) if p[0] == "--ro-bind" and p[2] == "/tmp/ci/venv")
    assert tmp_at < venv_at
