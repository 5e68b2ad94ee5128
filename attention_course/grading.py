"""Grade a submitted exercise notebook from the command line.

``attention-course grade SUBMISSION.ipynb [--json] [--timeout SECONDS]``

1. The notebook runs top to bottom in a fresh ``python3`` kernel (nbclient), each cell
   under a time limit. A cell that raises or runs over its limit is recorded and the run
   goes on, so one broken cell costs only what depends on it. The check cells are
   skipped: the grader runs the checks itself, so deleting or editing a check cell
   changes nothing.
2. For every task listed in the notebook's metadata (``metadata.attention_course.tasks``,
   written by the solved twin and kept by ``attention-course release``), the grader runs
   the task's checker, or its quiz check, **in its own process**, on a proxy of the
   student's object (:mod:`attention_course.sandbox`): the kernel only evaluates the
   student's code on the inputs it is sent and returns the results as data. Nothing the
   notebook patches (the checkers, ``torch.allclose``, ``Tensor.__eq__``, the report,
   printed lines) can change a score, and the checkers and their messages are the ones
   the check cells show.
3. Each task scores ``points x report.score``. What could not run scores zero, with the
   reason: not defined (and why: the cell that defines it raised, or timed out, or was
   deleted), the reference imported instead of the student's own code, a check that ran
   over its time limit (the call is interrupted), a kernel that died or did not come back
   after an interrupt.
4. The table shows, for each task that lost points, the first failing case with its
   whole message: the first line on the task's row, then the lines that name the
   mistake ("Likely mistake: ...", "Hint: ...") or the line of code that raised,
   wrapped under it. ``--json`` gives the same text as the task's ``reason``, and every
   case's message in the task's ``report``.

The exit status is 0 only when every task passes. ``--json`` prints a JSON document for
a learning-management system instead of the table.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .notebooks import (
    KERNEL_NAME,
    add_timeout_argument,
    command_main,
    missing_tools,
    notebook_client,
)

if TYPE_CHECKING:  # nbformat and nbclient come with the `dev` extra; imported when used
    from nbformat import NotebookNode

DEFAULT_TIMEOUT = 60.0
CHECK_TIMEOUT = 10.0  # each checker case's own time limit
TABLE_WIDTH = 100  # the score table wraps messages to this many characters


@dataclass
class CellRun:
    """What happened to one code cell of the submission."""

    index: int
    id: str
    status: str  # "ok", "error", "timeout", "skipped", "not run"
    error: str = ""


@dataclass
class TaskGrade:
    """The grade of one task."""

    id: str
    kind: str  # "check" or "quiz"
    name: str
    points: float
    score: float = 0.0
    fraction: float = 0.0
    passed: bool = False
    reason: str = ""  # why points were lost: the first failing case and its whole message
    notes: list[str] = field(default_factory=list)
    report: dict | None = None


@dataclass
class Grade:
    """The grade of a whole notebook."""

    notebook: str
    exercise: str
    tasks: list[TaskGrade]
    cells: list[CellRun]
    timeout: float

    @property
    def score(self) -> float:
        return round(sum(t.score for t in self.tasks), 2)

    @property
    def max_score(self) -> float:
        return sum(t.points for t in self.tasks)

    @property
    def passed(self) -> bool:
        return bool(self.tasks) and all(t.passed for t in self.tasks)

    def to_dict(self) -> dict:
        return {
            "notebook": self.notebook,
            "exercise": self.exercise,
            "score": self.score,
            "max_score": self.max_score,
            "passed": self.passed,
            "timeout": self.timeout,
            "tasks": [asdict(t) for t in self.tasks],
            "cell_problems": [asdict(c) for c in self.cells if c.status in ("error", "timeout")],
        }

    def table(self, width: int = TABLE_WIDTH) -> str:
        """The score table printed by ``attention-course grade``.

        The last column holds the first failing case's whole message: its first line on
        the task's row, the rest (expected vs got, the named mistake or hint) on the
        lines below, indented under the column and wrapped to ``width`` characters.
        """
        rows = [("task", "points", "score", "first failing case and its message")]
        for t in self.tasks:
            rows.append((t.name, f"{t.score:g}/{t.points:g}", f"{t.fraction:.0%}", t.reason))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        indent = " " * (sum(widths) + 6)
        lines = [f"{self.exercise} ({self.notebook})"]
        for row in rows:
            cells = [row[i].ljust(widths[i]) for i in range(3)]
            first, *rest = row[3].splitlines() or [""]
            lines.append(("  ".join(cells) + "  " + first).rstrip())
            for line in rest:
                lines.extend(_wrap(line, indent, width))
        lines.append(f"total: {self.score:g}/{self.max_score:g}")
        notes = [f"  {t.name}: {note}" for t in self.tasks for note in t.notes]
        problems = [
            f"  cell {c.index} ({c.id}): {c.error}"
            for c in self.cells
            if c.status in ("error", "timeout")
        ]
        if notes:
            lines += ["notes:", *notes]
        if problems:
            lines += ["cells that failed:", *problems]
        return "\n".join(lines)


def _wrap(line: str, indent: str, width: int) -> list[str]:
    """``line`` indented by ``indent``, wrapped to ``width`` (its own leading spaces,
    which align "expected" and "got" rows, are kept)."""
    body = line.rstrip()
    lead = body[: len(body) - len(body.lstrip())]
    wrapped = textwrap.wrap(
        body.strip(),
        width=max(40, width - len(indent) - len(lead)),
        break_long_words=False,
        break_on_hyphens=False,
    )
    first, *more = wrapped or [""]
    return [indent + lead + first] + [indent + lead + "  " + part for part in more]


# ---------------------------------------------------------------- tasks


def _nbgrader(cell: NotebookNode) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _is_check_cell(cell: NotebookNode) -> bool:
    meta = _nbgrader(cell)
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


_CHECK_CALL = re.compile(r"\b(check_\w+)\(\s*(\w+)\s*\)")
_QUIZ_CALL = re.compile(r"""\bcheck_quiz\(\s*["']([\w.]+)["']\s*,\s*(\w+)\s*\)""")


def find_tasks(nb: NotebookNode) -> list[dict]:
    """The tasks to grade: the notebook's metadata, else what its check cells call."""
    tasks = nb.metadata.get("attention_course", {}).get("tasks")
    if tasks:
        return [dict(t) for t in tasks]
    found = []
    for cell in nb.cells:
        if not _is_check_cell(cell):
            continue
        meta = _nbgrader(cell)
        points = meta.get("points", 1)
        quiz = _QUIZ_CALL.search(cell.source)
        call = _CHECK_CALL.search(cell.source)
        if quiz:
            question, name = quiz.groups()
            found.append({"kind": "quiz", "question": question, "name": name, "points": points})
        elif call and call.group(1) in _checker_names():
            found.append({"kind": "check", "checker": call.group(1), "name": call.group(2)})
            found[-1]["points"] = points
        else:
            continue
        found[-1]["id"] = found[-1]["name"]
        found[-1]["check_cell"] = meta.get("grade_id")
    return found


def _checker_names() -> set[str]:
    """The checkers' function names, for notebooks without task metadata."""
    from .checks import REGISTRY

    return {c.check.__name__ for c in REGISTRY}


# ---------------------------------------------------------------- the checks, out of reach


def _kernel_hooks(runner: _Runner):
    """(execute, interrupt, alive, wait) for :class:`sandbox.Session` on the runner's kernel."""
    import os
    import signal

    client = runner.client

    def process():
        return getattr(getattr(client.km, "provisioner", None), "process", None)

    def execute(source: str) -> str:
        return client.kc.execute(source, store_history=False, allow_stdin=False)

    def interrupt() -> None:
        proc = process()
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)

    def alive() -> bool:
        proc = process()
        return proc is None or proc.poll() is None

    def wait(msg_id: str, limit: float) -> bool:
        """Wait up to ``limit`` seconds for the probe cell's reply; True when it came."""
        import queue
        import time

        from jupyter_core.utils import run_sync

        async def reply() -> bool:
            deadline = time.monotonic() + limit
            while (left := deadline - time.monotonic()) > 0:
                try:
                    msg = await client.kc.shell_channel.get_msg(timeout=left)
                except queue.Empty:
                    return False
                if msg.get("parent_header", {}).get("msg_id") == msg_id:
                    return True
            return False

        return run_sync(reply)()

    return execute, interrupt, alive, wait


def _grade_task(runner: _Runner, task: dict, check_timeout: float) -> dict:
    """Grade one task: the checker runs here, on proxies of the kernel's objects.

    Returns the result ``_fill`` reads; raises :class:`sandbox.KernelLost` when the
    kernel died or did not come back from an interrupt.
    """
    from . import sandbox

    execute, interrupt, alive, wait = _kernel_hooks(runner)
    # each remote call may take a little longer than its case, so that the case's own
    # time limit speaks first ("ran over the time limit of ... s")
    session = sandbox.Session(
        execute,
        interrupt,
        alive,
        limit=check_timeout + 1.0,
        finished=lambda msg_id: wait(msg_id, 0.05),
    )
    try:
        with session as client:
            result = sandbox.grade_task(client, task, check_timeout)
    except sandbox.KernelLost:
        raise
    except sandbox.SandboxError as error:  # the notebook broke the grader's probe
        result = {"status": "sabotaged", "error": str(error)}
    except Exception as error:  # noqa: BLE001 - a grader bug must not stop grading
        result = {"status": "crashed", "error": f"{type(error).__name__}: {error}"}
    if session.msg_id is not None and alive():
        if not wait(session.msg_id, sandbox.INTERRUPT_GRACE * 2):
            interrupt()
            if not wait(session.msg_id, sandbox.INTERRUPT_GRACE):
                raise sandbox.KernelLost("hung", "the kernel did not come back after an interrupt")
    if not alive():
        raise sandbox.KernelLost("died", "the kernel died")
    return result


# ---------------------------------------------------------------- the run


def _error_text(output: dict) -> str:
    value = str(output.get("evalue", "")).strip().splitlines()
    return f"{output.get('ename', 'Error')}" + (f": {value[0]}" if value else "")


def _cell_outcome(cell: NotebookNode, reply: dict | None, limit: float) -> tuple[str, str]:
    content = (reply or {}).get("content", {})
    if content.get("ename") == "CellTimeoutError":
        return "timeout", f"ran over the time limit of {limit:g} s and was interrupted"
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return "error", _error_text(output)
    if content.get("status") == "error":
        return "error", _error_text(content)
    return "ok", ""


class _Runner:
    """Execute cells one by one in one kernel, recording each outcome."""

    def __init__(self, nb: NotebookNode, cwd: Path, timeout: float, kernel_name: str):
        self.timeout = timeout
        self.replies: dict[int, dict] = {}
        self.client = notebook_client(
            nb,
            cwd,
            timeout,
            kernel_name,
            allow_errors=True,
            interrupt_on_timeout=True,
            error_on_timeout={
                "ename": "CellTimeoutError",
                "evalue": f"cell execution exceeded {timeout:g} s",
                "traceback": [],
            },
            on_cell_executed=self._record,
        )

    def _record(self, cell, cell_index, execute_reply) -> None:
        self.replies[cell_index] = execute_reply

    def run(
        self, cell: NotebookNode, index: int, timeout: float | None = None, history: bool = True
    ) -> tuple[str, str]:
        """Execute one cell; returns (status, error text)."""
        self.client.timeout = int(max(1, round(timeout or self.timeout)))
        self.client.execute_cell(cell, index, store_history=history)
        return _cell_outcome(cell, self.replies.get(index), timeout or self.timeout)


def grade_notebook(
    path: str | Path,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    check_timeout: float = CHECK_TIMEOUT,
    kernel_name: str = KERNEL_NAME,
) -> Grade:
    """Execute and grade one submission; never raises because of the submission."""
    import nbformat
    from nbclient.exceptions import DeadKernelError

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    exercise = nb.metadata.get("attention_course", {}).get("exercise", path.stem)
    tasks = find_tasks(nb)
    cell_index = {_nbgrader(c).get("grade_id"): i for i, c in enumerate(nb.cells)}
    cell_index.pop(None, None)

    runs: dict[int, CellRun] = {}
    grades = [
        TaskGrade(
            id=t.get("id", t["name"]), kind=t["kind"], name=t["name"], points=t.get("points", 1)
        )
        for t in tasks
    ]
    runner = _Runner(nb, path.parent.resolve(), timeout, kernel_name)
    from .sandbox import warm_up

    warming = warm_up()  # the checkers run in this process: ready them while cells run
    died_at: int | None = None
    with runner.client.setup_kernel(cleanup_kc=True):
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            cell_id = cell.get("id", "")
            if died_at is not None:
                runs[index] = CellRun(
                    index, cell_id, "not run", f"the kernel died in cell {died_at}"
                )
                continue
            if _is_check_cell(cell):
                runs[index] = CellRun(index, cell_id, "skipped")
                continue
            try:
                status, error = runner.run(cell, index)
            except DeadKernelError:
                died_at = index
                status, error = "error", "the kernel died while running this cell"
            runs[index] = CellRun(index, cell_id, status, error)

        from .sandbox import KernelLost

        warming.join()
        lost: KernelLost | None = None
        for task, grade in zip(tasks, grades, strict=True):
            if died_at is not None:
                grade.reason = f"not graded: the kernel died while running cell {died_at}"
                continue
            if lost is not None:
                grade.reason = f"not graded: the kernel {lost.reason} in an earlier task's check"
                continue
            try:
                result = _grade_task(runner, task, check_timeout)
            except KernelLost as error:
                lost = error
                if error.reason == "died":
                    grade.reason = "not graded: the kernel died while running its check"
                else:
                    grade.reason = (
                        "the check did not finish: ran over the time limit and the kernel "
                        "did not come back after an interrupt"
                    )
                continue
            _fill(grade, task, "ok", "", result, nb, cell_index, runs)

    cells = [runs[i] for i in sorted(runs)]
    return Grade(str(path), exercise, grades, cells, timeout)


def _fill(
    grade: TaskGrade,
    task: dict,
    status: str,
    error: str,
    result: dict | None,
    nb: NotebookNode,
    cell_index: dict,
    runs: dict[int, CellRun],
) -> None:
    """Turn one kernel result into a score and a reason."""
    check_cell = task.get("check_cell")
    if check_cell and check_cell not in cell_index:
        grade.notes.append("its check cell was deleted; graded anyway")
    if status == "timeout":
        grade.reason = f"the check did not finish: {error}"
        return
    if result is None:
        grade.reason = f"the grader could not run the check ({error or 'no result'})"
        return
    if result["status"] == "missing":
        grade.reason = f"`{grade.name}` is not defined" + _why_missing(task, nb, cell_index, runs)
        return
    if result["status"] == "reference":
        grade.reason = (
            f"`{grade.name}` is the reference imported from {result['module']}, "
            "not the notebook's own code"
        )
        return
    if result["status"] == "sabotaged":
        grade.reason = f"not graded: {result['error']}"
        return
    if result["status"] == "crashed":
        grade.reason = f"the grader failed on this task (please report it): {result['error']}"
        return
    report = result["report"]
    grade.report = report
    grade.fraction = float(report["score"])
    grade.passed = bool(report["passed"])
    grade.score = round(grade.points * grade.fraction, 2)
    failing = [r for r in report["results"] if not r["passed"]]
    if failing:
        # The whole message, not only its first line: the lines below it name the
        # mistake ("Likely mistake: ...", "Hint: ...") or the line of code that raised.
        first = failing[0]
        message = (first["message"] or "").strip()
        grade.reason = first["name"] + (f": {message}" if message else "")


def _why_missing(task: dict, nb: NotebookNode, cell_index: dict, runs: dict[int, CellRun]) -> str:
    cell_name = task.get("solution_cell")
    if cell_name is None:
        return ""
    index = cell_index.get(cell_name)
    if index is None:
        return f" (the cell that defines it, {cell_name!r}, was deleted)"
    run = runs.get(index)
    if run is None or run.status == "ok":
        return f" (cell {index} no longer defines it)"
    if run.status == "timeout":
        return f" (cell {index}, which defines it, {run.error})"
    if run.status == "error":
        return f" (cell {index}, which defines it, raised {run.error})"
    return f" (cell {index}, which defines it, was {run.status}: {run.error})"


# ---------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the ``grade`` command line (shared by the CLI and ``python -m``)."""
    parser.add_argument("submission", type=Path, metavar="SUBMISSION.ipynb")
    parser.add_argument(
        "--json", action="store_true", help="print a JSON document instead of the table"
    )
    add_timeout_argument(parser, DEFAULT_TIMEOUT, "for each cell of the submission")


def run(args: argparse.Namespace) -> int:
    """Carry out a parsed ``grade`` command; return the exit status."""
    if missing_tools("grade", sys.stderr):
        return 2
    import nbformat

    try:
        nb = nbformat.read(args.submission, as_version=4)
    except (OSError, ValueError) as err:  # missing file, not JSON, not a notebook
        print(f"grade: cannot read {args.submission}: {err}", file=sys.stderr)
        return 2
    if not find_tasks(nb):
        print(f"grade: {args.submission} lists no exercise tasks", file=sys.stderr)
        return 2
    grade = grade_notebook(args.submission, timeout=args.timeout)
    if args.json:
        print(json.dumps(grade.to_dict(), indent=2, ensure_ascii=False))
    else:
        print(grade.table())
    return 0 if grade.passed else 1


def main(argv: Sequence[str] | None = None) -> int:
    return command_main(
        "attention-course grade",
        "Execute a submitted exercise notebook and grade every task in it.",
        add_arguments,
        run,
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
