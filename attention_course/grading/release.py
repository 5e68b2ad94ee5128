"""Make the student exercise notebooks from their solved twins.

An instructor edits only ``exercises/solutions/NN_name.ipynb``. In its code cells the
solution sits between two marker lines, the convention nbgrader uses::

    def soft_argmax(scores, beta=1.0, dim=-1):
        \"\"\"Docstring the student keeps.\"\"\"
        ### BEGIN SOLUTION
        return torch.softmax(beta * scores, dim=dim)
        ### END SOLUTION

:func:`make_student_notebook` replaces every such block with ``raise
NotImplementedError`` at the marker's indentation (the signature and docstring above the
markers stay), replaces a markdown answer block with a placeholder, drops cells tagged
``solution-only`` and clears the outputs. :func:`release` then executes the result in a
fresh ``python3`` kernel so that the student copy is committed with the failing
"not implemented yet" reports a student first sees.

It also records each exercise's task list, as the solved twin declares it
(``metadata.attention_course.tasks``), in the repository's (:func:`repository_records`,
never an installed package's) ``attention_course/exercise_tasks.json`` under the
twin's file stem: the grader grades those tasks, never the list in a submission, which a
student can edit (:func:`attention_course.grading.grade.tasks_to_grade`), and what the student
copy gives in ``exercise_given.json`` (:func:`attention_course.grading.cheats.given_code`): the
reference names its given cells import are the building blocks the cheat scan allows
(an import a student adds is not one), and a statement it gives, kept verbatim
(``model = ac.GPT(...)``), is not the student's use of the reference.

``attention-course release --check`` regenerates every student copy in memory and lists
those whose committed file differs (or whose entry in ``exercise_tasks.json`` or
``exercise_given.json`` does), so
a solution edited without re-releasing cannot land.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .cheats import given_code
from .notebooks import (
    KERNEL_SPEC,
    add_timeout_argument,
    command_main,
    missing_tools,
    notebook_client,
)

if TYPE_CHECKING:  # nbformat and nbclient come with the `dev` extra; imported when used
    from nbformat import NotebookNode

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"
CODE_PLACEHOLDER = "raise NotImplementedError"
MARKDOWN_PLACEHOLDER = "*Your answer here.*"
SOLUTION_ONLY_TAG = "solution-only"
DEFAULT_CELL_TIMEOUT = 120.0
TASKS_NOTE = "its task list in attention_course/exercise_tasks.json differs"
GIVEN_NOTE = "its given cells in attention_course/exercise_given.json differ"


class ReleaseError(ValueError):
    """A solution notebook whose markers cannot be turned into a student copy."""


def strip_solution(source: str, placeholder: str = CODE_PLACEHOLDER, where: str = "cell") -> str:
    """Replace each ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` block by ``placeholder``.

    The placeholder keeps the indentation of the ``BEGIN`` marker line, so a block inside a
    function body stays inside it. Lines outside the blocks are kept exactly.
    ``where`` names the cell in error messages. Raises :class:`ReleaseError` for an
    unterminated, unopened or nested block.
    """
    kept: list[str] = []
    inside = False
    for number, line in enumerate(source.splitlines(keepends=True), start=1):
        marker = line.strip()
        if marker == BEGIN_SOLUTION:
            if inside:
                raise ReleaseError(f"{where}, line {number}: nested {BEGIN_SOLUTION!r}")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            kept.append(indent + placeholder)
        elif marker == END_SOLUTION:
            if not inside:
                raise ReleaseError(
                    f"{where}, line {number}: {END_SOLUTION!r} without {BEGIN_SOLUTION!r}"
                )
            inside = False
            if line.endswith("\n"):  # the placeholder ends where the END marker ended
                kept[-1] += "\n"
        elif not inside:
            kept.append(line)
    if inside:
        raise ReleaseError(f"{where}: {BEGIN_SOLUTION!r} is never closed by {END_SOLUTION!r}")
    return "".join(kept)


def make_student_notebook(solution: NotebookNode) -> NotebookNode:
    """Return the student copy of a solved notebook, unexecuted (outputs cleared).

    The solution notebook is not modified. Cell ids are kept, so the student copy of a
    cell can be traced back to its solved twin.
    """
    student = copy.deepcopy(solution)
    cells = []
    for index, cell in enumerate(student.cells):
        if SOLUTION_ONLY_TAG in cell.get("metadata", {}).get("tags", []):
            continue
        where = f"cell {index} ({cell.get('id', 'no id')})"
        if cell.cell_type == "code":
            cell.source = strip_solution(cell.source, CODE_PLACEHOLDER, where)
            cell.outputs = []
            cell.execution_count = None
        elif cell.cell_type == "markdown":
            cell.source = strip_solution(cell.source, MARKDOWN_PLACEHOLDER, where)
        cells.append(cell)
    student.cells = cells
    course = student.metadata.setdefault("attention_course", {})
    course["solutions"] = False
    student.metadata["kernelspec"] = dict(KERNEL_SPEC)
    return student


def execute_notebook(
    nb: NotebookNode, cwd: Path, timeout: float = DEFAULT_CELL_TIMEOUT
) -> NotebookNode:
    """Execute ``nb`` in place in a fresh ``python3`` kernel whose working directory is ``cwd``.

    Cells tagged ``raises-exception`` (the check cells) may fail; any other error stops
    the run with nbclient's ``CellExecutionError``. Tracebacks are then shortened to
    their last line, so the committed file holds no machine paths.
    """
    notebook_client(nb, cwd, timeout).execute(cleanup_kc=True)
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                output["traceback"] = [f"{output['ename']}: {output['evalue']}"]
    nb.metadata.pop("widgets", None)
    return nb


def normalise(nb: NotebookNode) -> dict:
    """A comparable view of a notebook: sources, metadata and outputs, minus volatile fields.

    Dropped: execution counts, cell ids, tracebacks (they name files on the machine),
    images (their bytes depend on the matplotlib version), and the kernel's
    ``language_info`` (it names the Python version).
    """
    metadata = {k: v for k, v in nb.metadata.items() if k not in ("language_info", "widgets")}
    cells = []
    for cell in nb.cells:
        entry = {
            "cell_type": cell.cell_type,
            "source": cell.source,
            "metadata": {k: v for k, v in cell.get("metadata", {}).items() if k != "execution"},
        }
        if cell.cell_type == "code":
            entry["outputs"] = [_normalise_output(out) for out in cell.get("outputs", [])]
        cells.append(entry)
    return {"metadata": metadata, "cells": cells}


def _normalise_output(output: NotebookNode) -> dict:
    kept = {k: v for k, v in output.items() if k not in ("execution_count", "traceback")}
    if "data" in kept:
        kept["data"] = {k: v for k, v in kept["data"].items() if not k.startswith("image/")}
    if "metadata" in kept:
        kept["metadata"] = {}
    return kept


def student_path(solution_path: Path) -> Path:
    """``exercises/solutions/NN.ipynb`` -> ``exercises/NN.ipynb``."""
    return solution_path.parent.parent / solution_path.name


_WHAT = {
    "cell_type": "the cell type differs",
    "source": "the source differs",
    "metadata": "the metadata differs",
    "outputs": "the outputs differ",
}


def differences(expected: NotebookNode, committed: NotebookNode, outputs: bool = True) -> list[str]:
    """Say in words where ``committed`` differs from ``expected`` (empty when equal)."""
    want, have = normalise(expected), normalise(committed)
    problems = []
    if want["metadata"] != have["metadata"]:
        problems.append("notebook metadata differs")
    if len(want["cells"]) != len(have["cells"]):
        problems.append(f"{len(have['cells'])} cells, expected {len(want['cells'])}")
    for index, (a, b) in enumerate(zip(want["cells"], have["cells"], strict=False)):
        for key in ("cell_type", "source", "metadata") + (("outputs",) if outputs else ()):
            if a.get(key) != b.get(key):
                problems.append(f"cell {index}: {_WHAT[key]}")
    return problems


def declared_tasks(solution: NotebookNode, solution_path: Path) -> list[dict]:
    """The task list a solved twin declares; its ``exercise`` must be its file stem."""
    course = solution.metadata.get("attention_course", {})
    if course.get("exercise") != solution_path.stem:
        raise ReleaseError(
            f"{solution_path}: metadata.attention_course.exercise is "
            f"{course.get('exercise')!r}, expected the file stem {solution_path.stem!r}"
        )
    return [dict(task) for task in course.get("tasks", [])]


def tasks_path() -> Path:
    """The package's ``exercise_tasks.json``: each exercise's released task list."""
    return Path(__file__).resolve().parent.parent / "exercise_tasks.json"


def given_path() -> Path:
    """The package's ``exercise_given.json``: what each exercise's student copy gives."""
    return Path(__file__).resolve().parent.parent / "exercise_given.json"


def repository_records(solution_path: Path) -> tuple[Path, Path]:
    """The ``exercise_tasks.json`` and ``exercise_given.json`` that ``release`` writes: the
    ones of the repository that holds ``solution_path`` (``REPO/exercises/solutions/NN.ipynb``
    -> ``REPO/attention_course/``), never the installed package's, which the grader reads
    (with an editable install they are the same files). An authoring command acts on the
    repository; a package built from it carries the records."""
    repository = solution_path.resolve().parent.parent.parent
    package = repository / "attention_course"
    if not (package / "__init__.py").is_file():
        raise ReleaseError(
            f"{solution_path}: release writes the task lists into the repository's "
            f"attention_course/ folder, expected at {package} (a solved twin lives in "
            "REPO/exercises/solutions/): run it on a clone of the course's repository"
        )
    return package / "exercise_tasks.json", package / "exercise_given.json"


def _released(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _record(path: Path, key: str, value) -> None:
    """Write ``value`` under exercise ``key`` in the JSON file ``path`` (keys sorted)."""
    known = _released(path)
    known[key] = value
    text = json.dumps(dict(sorted(known.items())), indent=1, sort_keys=True) + "\n"
    path.write_text(text, encoding="utf-8")


def released_given() -> dict[str, dict]:
    """Every exercise's given code (`attention_course.grading.cheats.given_code`), by key."""
    return _released(given_path())


def released_tasks() -> dict[str, list[dict]]:
    """Every exercise's released task list, by exercise key (the solved twin's file stem,
    e.g. ``04_scaled_dot_product``), as ``exercise_tasks.json`` holds them."""
    return _released(tasks_path())


def recorded_tasks(key: str) -> list[dict] | None:
    return released_tasks().get(key)


def release(
    solution_path: Path,
    *,
    check: bool = False,
    execute: bool = True,
    timeout: float = DEFAULT_CELL_TIMEOUT,
    refresh_solution: bool = False,
) -> list[str]:
    """Generate (or with ``check=True`` only compare) the student copy of one notebook.

    With ``refresh_solution=True`` the solved notebook is first re-executed and written
    back, so that its outputs follow a changed checker. Returns the list of differences
    found in check mode (empty otherwise).
    """
    import nbformat

    solution = nbformat.read(solution_path, as_version=4)
    if refresh_solution and not check:
        execute_notebook(solution, cwd=solution_path.parent, timeout=timeout)
        nbformat.validate(solution)
        nbformat.write(solution, solution_path)
    tasks = declared_tasks(solution, solution_path)
    tasks_file, given_file = repository_records(solution_path)
    student = make_student_notebook(solution)
    target = student_path(solution_path)
    if execute:
        execute_notebook(student, cwd=target.parent, timeout=timeout)
    if check:
        stale = [] if _released(tasks_file).get(solution_path.stem) == tasks else [TASKS_NOTE]
        if _released(given_file).get(solution_path.stem) != given_code(student):
            stale.append(GIVEN_NOTE)
        if not target.exists():
            return [f"{target} does not exist", *stale]
        committed = nbformat.read(target, as_version=4)
        return differences(student, committed, outputs=execute) + stale
    nbformat.validate(student)
    nbformat.write(student, target)
    _record(tasks_file, solution_path.stem, tasks)
    _record(given_file, solution_path.stem, given_code(student))
    return []


def default_solutions(root: Path = Path(".")) -> list[Path]:
    """Every solved notebook under ``root/exercises/solutions``, in chapter order."""
    return sorted((root / "exercises" / "solutions").glob("[0-9]*.ipynb"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the ``release`` command line (shared by the CLI and ``python -m``)."""
    parser.add_argument(
        "solutions",
        nargs="*",
        type=Path,
        metavar="SOLUTIONS",
        help="solved notebooks (default: exercises/solutions/*.ipynb)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 listing student copies that differ from what "
        "would be generated",
    )
    parser.add_argument(
        "--no-execute",
        action="store_true",
        help="skip executing the student copies (with --check: compare sources and metadata only)",
    )
    parser.add_argument(
        "--refresh-solutions",
        action="store_true",
        help="also re-execute the solved notebooks in place (after a checker changed)",
    )
    add_timeout_argument(parser, DEFAULT_CELL_TIMEOUT, "per cell")


def run(args: argparse.Namespace) -> int:
    """Carry out a parsed ``release`` command; return the exit status."""
    if missing_tools("release"):
        return 2
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    paths = args.solutions or default_solutions()
    if not paths:
        print("release: no solution notebooks found (looked in exercises/solutions/)")
        return 1
    stale = []
    for path in paths:
        try:
            problems = release(
                path,
                check=args.check,
                execute=not args.no_execute,
                timeout=args.timeout,
                refresh_solution=args.refresh_solutions,
            )
        except (ReleaseError, CellExecutionError, CellTimeoutError) as err:
            print(f"{path}: {str(err).strip()[-2000:]}")
            stale.append(path)
            continue
        if args.check:
            if problems:
                stale.append(path)
                print(f"{student_path(path)} is out of date with {path}:")
                for problem in problems:
                    print(f"  - {problem}")
        else:
            print(f"wrote {student_path(path)}")
    if args.check:
        if stale:
            print(f"{len(stale)} student notebook(s) out of date: run `attention-course release`")
            return 1
        print(f"{len(paths)} student notebook(s) up to date")
    return 1 if stale else 0


def main(argv: Sequence[str] | None = None) -> int:
    return command_main(
        "attention-course release",
        "Generate exercises/NN.ipynb from exercises/solutions/NN.ipynb.",
        add_arguments,
        run,
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
