"""Grade a submitted exercise notebook from the command line.

``attention-course grade SUBMISSION.ipynb [--json] [--timeout SECONDS]``, or for a class
``attention-course grade DIR_OR_FILES... [--jobs N] [--csv FILE] [--junit FILE] [--json]``
(`attention_course.grading.gradebook`).

1. The notebook runs top to bottom in a fresh ``python3`` kernel (nbclient), each cell
   under a time limit. A cell that raises or runs over its limit is recorded and the run
   goes on, so one broken cell costs only what depends on it. The check cells are
   skipped: the grader runs the checks itself, so deleting or editing a check cell
   changes nothing.
2. For every task of the exercise, as its solved twin declares them (the list that
   ``attention-course release`` writes to the package's ``exercise_tasks.json``; the
   notebook is matched by ``metadata.attention_course.exercise``, else by its file name,
   and a notebook whose own task list was edited is graded on the exercise's list, with a
   note; ``--trust-notebook`` grades an instructor's own notebook on its metadata), the
   grader runs
   the task's checker, or its quiz check, **in its own process**, on a proxy of the
   student's object (:mod:`attention_course.grading.sandbox`): the kernel only evaluates the
   student's code on the inputs it is sent and returns the results as data. Nothing the
   notebook patches (the checkers, ``torch.allclose``, ``Tensor.__eq__``, the report,
   printed lines) can change a score, and the checkers and their messages are the ones
   the check cells show.
   The checkers' drawn inputs follow a **run seed** that the grader draws afresh for each
   grading run (with :mod:`secrets`, on its own side; ``--seed N`` reuses one to reproduce
   a run) and records in each result (``"seed"`` in the JSON, a line of the table and of
   the feedback): outputs recorded for the check cell's inputs (seed 0) do not pass here.
   Inputs written out by hand are the same for every seed; a verdict does not depend on it.
3. Each task scores ``points x report.score``. What could not run scores zero, with the
   reason: not defined (and why: the cell that defines it raised, or timed out, or was
   deleted, or killed the kernel), a check that ran over its time limit (the call is
   interrupted), a kernel that died during the check or did not come back after an
   interrupt. In the sandbox the kernel sees the exercise's build of the package
   (`attention_course.grading.absent`), where every reference the exercise does not hand
   out is a stub: a solution that calls one scores 0, "calls attention_course.X, which
   is not available while grading", and a given cell that stops at one (a demonstration
   of the reference) is a note, not the student's problem. Absence holds only in the
   sandbox: with ``--no-sandbox``, and for the few targets that must stay real in their
   build (`absent.real_targets`), a candidate that *is* the reference scores 0 as "the
   reference imported". The static scan (`attention_course.grading.cheats`) applies the
   task's one policy (`attention_course.checks._policy`), as the check cell does: it
   scores 0 a solution that names a reference the exercise does not hand out or a
   built-in the task forbids (``--allow-builtins`` makes a built-in a note); what else
   it sees (``exec``, computed imports, hooks) is a note for the instructor.
4. The table shows, for each task that lost points, the first failing case with its
   whole message: the first line on the task's row, then the lines that name the
   mistake ("Likely mistake: ...", "Hint: ...") or the line of code that raised,
   wrapped under it. ``--json`` gives the same text as the task's ``reason``, and every
   case's message in the task's ``report``.
5. A cell that kills the kernel (or loops in compiled code past its limit) is marked
   ``died``; a fresh kernel replays the cells that had run and the run goes on, so a
   crash costs only what depends on it. Kernels run under ``--memory-limit``.

The exit status is 0 only when every task passes. ``--json`` prints a JSON document for
a learning-management system instead of the table.
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import sys
import textwrap
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ._kernel import DEFAULT_MEMORY_LIMIT, grader_kernel_manager, parse_size
from .notebooks import (
    KERNEL_NAME,
    add_timeout_argument,
    command_main,
    missing_tools,
    notebook_client,
)

if TYPE_CHECKING:  # nbformat and nbclient come with the `grader` extra; imported when used
    from nbformat import NotebookNode

DEFAULT_TIMEOUT = 60.0
CHECK_TIMEOUT = 10.0  # each checker case's own time limit
MAX_RESTARTS = 3  # kernels restarted after a crash, per submission
TABLE_WIDTH = 100  # the score table wraps messages to this many characters
WARM_UP_TIMEOUT = 300.0  # seconds for the kernel's warm-up (not the student's time)
WARM_UP = (
    "import torch, torch._dynamo\n"
    "torch.ones(2, 2, device='meta').tril()\n"
    "torch.ones(2, 2).tril().sum()\n"
)


@dataclass
class CellRun:
    """What happened to one code cell of the submission."""

    index: int
    id: str
    # "ok", "error", "timeout", "died" (killed the kernel), "skipped", "not run", "absent" (a
    # given cell that stopped at a reference the sandbox leaves out: not the student's)
    status: str
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
    findings: list[dict] = field(default_factory=list)  # code that is not the student's own


@dataclass
class Grade:
    """The grade of a whole notebook."""

    notebook: str
    exercise: str
    tasks: list[TaskGrade]
    cells: list[CellRun]
    timeout: float
    notes: list[str] = field(default_factory=list)  # about the whole notebook
    sandboxed: bool = True  # the kernel ran in a bwrap sandbox (False: --no-sandbox)
    seed: int | None = None  # the run seed the checks' inputs were drawn from (`draw_seed`)

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
            "sandboxed": self.sandboxed,
            "seed": self.seed,
            "tasks": [asdict(t) for t in self.tasks],
            "notes": list(self.notes),
            "cell_problems": [
                asdict(c) for c in self.cells if c.status in ("error", "timeout", "died")
            ],
        }

    @classmethod
    def from_dict(cls, data: dict) -> Grade:
        """The grade that :meth:`to_dict` wrote (its cells: only those that failed)."""
        fields = set(TaskGrade.__dataclass_fields__)
        tasks = [TaskGrade(**{k: v for k, v in t.items() if k in fields}) for t in data["tasks"]]
        cells = [CellRun(**c) for c in data.get("cell_problems", [])]
        return cls(
            data["notebook"],
            data["exercise"],
            tasks,
            cells,
            data.get("timeout", DEFAULT_TIMEOUT),
            list(data.get("notes", [])),
            bool(data.get("sandboxed", True)),
            data.get("seed"),
        )

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
        if self.seed is not None:
            lines.append(f"inputs drawn with seed {self.seed} (reproduce: --seed {self.seed})")
        notes = [f"  {note}" for note in self.notes]
        notes += [f"  {t.name}: {note}" for t in self.tasks for note in t.notes]
        problems = [
            f"  cell {c.index} ({c.id}): {c.error}"
            for c in self.cells
            if c.status in ("error", "timeout", "died")
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


EDITED_NOTE = "the notebook's task list was edited; the exercise's own list was used"


class UnknownExercise(ValueError):
    """A submission whose exercise the grader cannot tell, so it has no task list to trust."""


def exercise_tasks() -> dict[str, list[dict]]:
    """The instructor's task list of every exercise, by exercise key, as
    ``attention-course release`` wrote it (`attention_course.grading.release.released_tasks`)."""
    from .release import released_tasks

    return released_tasks()


def exercise_key(nb: NotebookNode, path: str | Path) -> str:
    """The exercise a submission is: its metadata's ``exercise``, else its file name stem."""
    key = nb.metadata.get("attention_course", {}).get("exercise")
    return str(key) if isinstance(key, str) and key else Path(path).stem


def tasks_to_grade(
    nb: NotebookNode, path: str | Path, trust_notebook: bool = False
) -> tuple[str, list[dict], list[str]]:
    """(exercise key, its tasks, notes): the tasks the instructor released, never the
    submission's own list, which a student can edit (drop a failed task, raise the points,
    point a task at an easier check). A key edited to another exercise's grades that
    exercise's tasks, whose names the notebook does not define: zeros.

    ``trust_notebook``: the notebook's own list (an instructor's notebook). Raises
    :class:`UnknownExercise` when the exercise has no released task list.
    """
    key = exercise_key(nb, path)
    own = find_tasks(nb)
    if trust_notebook:
        return key, own, []
    released = exercise_tasks()
    if key not in released:
        raise UnknownExercise(
            f"{path}: cannot tell which exercise this is ({key!r} is not one of "
            f"{len(released)} released exercises); grade an instructor's own notebook "
            "with --trust-notebook"
        )
    tasks = [dict(t) for t in released[key]]
    return key, tasks, [] if own == tasks else [EDITED_NOTE]


def _policy(task: dict) -> dict:
    """The task's policy record (`attention_course.checks._policy`), from its checker's
    declaration: the same record the check cell enforces. A quiz has none."""
    from ..checks import CHECKERS
    from ..checks._policy import policy_record

    checker = CHECKERS.get(str(task.get("checker", "")).removeprefix("check_"))
    return policy_record(checker) if checker is not None else {}


def _checker_names() -> set[str]:
    """The checkers' function names, for notebooks without task metadata."""
    from ..checks import REGISTRY

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
        if hasattr(client.km, "interrupt_pid"):  # the kernel, not bwrap around it
            client.km.interrupt_pid()
            return
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


def draw_seed() -> int:
    """A fresh run seed for the checkers' drawn inputs, from :mod:`secrets` (never 0, the
    check cells' seed)."""
    return secrets.randbelow(2**31 - 1) + 1


_CHECKS_ONE_AT_A_TIME = threading.Lock()


def _grade_task(runner: _Runner, task: dict, check_timeout: float, seed: int = 0) -> dict:
    """Grade one task: the checker runs here, on proxies of the kernel's objects.

    Returns the result ``_fill`` reads; raises :class:`sandbox.KernelLost` when the
    kernel died or did not come back from an interrupt.
    """
    from . import sandbox

    execute, interrupt, alive, wait = _kernel_hooks(runner)
    # Each remote call may use ``check_timeout`` CPU seconds of the kernel (the kernel
    # and what it started), whatever the load on the machine; the case's wall-time
    # limit in the grader is only a guard far above it (`sandbox.WALL_FACTOR`).
    session = sandbox.Session(
        execute,
        interrupt,
        alive,
        limit=check_timeout,
        finished=lambda msg_id: wait(msg_id, 0.05),
        folder=str(runner.scratch.run) if runner.scratch is not None else None,
        cpu=getattr(runner.client.km, "cpu_seconds", None),
    )
    try:
        # One task's checks at a time in this process: they seed and draw from torch's
        # global random state (dropout cases), which `--jobs` grading threads share.
        with _CHECKS_ONE_AT_A_TIME, session as client:
            result = sandbox.grade_task(client, task, check_timeout, seed)
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
    """Execute cells one by one in one kernel, recording each outcome.

    When the kernel dies (``os._exit``, a segmentation fault, the out-of-memory killer),
    or a cell runs over its limit and cannot be interrupted (a loop in C code),
    `restart` starts a fresh kernel and replays the cells that had run, so that the
    cells after the one that died see the definitions they need.
    """

    def __init__(
        self,
        nb: NotebookNode,
        cwd: Path,
        timeout: float,
        kernel_name: str,
        memory_limit: int = DEFAULT_MEMORY_LIMIT,
        scratch=None,
        limits=None,
        package=None,
    ):
        self.nb = nb
        self.package = package  # the exercise's build of the package (absent.build)
        self.timeout = timeout
        self.kernel_name = kernel_name
        self.memory_limit = memory_limit
        self.scratch = scratch  # isolation.Scratch: the kernel runs in a bwrap sandbox
        self.limits = limits
        self.leftovers = 0  # processes the submission left running, ended with the sandbox
        self.replies: dict[int, dict] = {}
        self.replay: list[int] = []  # cells to run again after a restart, in order
        self.restarts = 0
        self._context = None
        self.client = notebook_client(
            nb,
            scratch.work if scratch is not None else cwd,
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

    # -- the kernel's life

    def start(self) -> None:
        options = {}
        if self.kernel_name == KERNEL_NAME:
            import subprocess

            self.client.km = grader_kernel_manager(
                self.memory_limit, self.scratch, self.limits, self.package
            )
            # The kernel's own stdout/stderr (not the cells' outputs, which come as
            # messages) would land on the grader's terminal: ipykernel's warnings, a
            # forked child's complaints, C libraries' messages.
            options = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self._context = self.client.setup_kernel(cleanup_kc=True, **options)
        self._context.__enter__()
        self.warm_up()

    def warm_up(self) -> None:
        """Do, before any of the notebook's cells, what a first call would otherwise pay
        for inside a case's time limit: the first operation on the ``meta`` device
        imports hundreds of modules (sympy, ``torch._dynamo``), seconds of work that
        once cost correct solutions points and, interrupted, broke the next case. In a
        namespace of its own: the notebook sees nothing of it."""
        cell = nbformat_new_cell(f"exec({WARM_UP!r}, {{}})")
        self.nb.cells.append(cell)
        try:
            self.run(cell, len(self.nb.cells) - 1, WARM_UP_TIMEOUT, history=False)
        except Exception:  # noqa: BLE001 - a kernel that dies here dies again in its cells
            pass
        finally:
            self.nb.cells.pop()

    def stop(self) -> None:
        km = self.client.km
        if hasattr(km, "leftover_processes"):
            self.leftovers += km.leftover_processes()
        if self._context is not None:
            context, self._context = self._context, None
            try:
                context.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - a kernel that is already gone
                pass
        if hasattr(km, "kill_process_group"):
            km.kill_process_group()  # what the submission forked dies with its kernel

    def how_it_died(self) -> str:
        describe = getattr(self.client.km, "exit_description", None)
        return describe() if describe else ""

    def restart(self) -> None:
        """A fresh kernel, with the cells in ``self.replay`` run again (quietly)."""
        self.restarts += 1
        graceful, self.client.shutdown_kernel = self.client.shutdown_kernel, "immediate"
        try:
            self.stop()  # a dead or hung kernel: no polite shutdown request
        finally:
            self.client.shutdown_kernel = graceful
        self.start()
        for index in self.replay:
            cell = nbformat_copy(self.nb.cells[index])
            self.nb.cells.append(cell)
            try:
                self.run(cell, len(self.nb.cells) - 1)
            finally:
                self.nb.cells.pop()

    def responsive(self, limit: float = 10.0) -> bool:
        """Whether the kernel answers a trivial cell within ``limit`` seconds."""
        from nbclient.exceptions import DeadKernelError

        probe = nbformat_new_cell("pass")
        self.nb.cells.append(probe)
        try:
            status, _ = self.run(probe, len(self.nb.cells) - 1, limit, history=False)
        except DeadKernelError:
            return False
        finally:
            self.nb.cells.pop()
        return status == "ok"

    def run(
        self, cell: NotebookNode, index: int, timeout: float | None = None, history: bool = True
    ) -> tuple[str, str]:
        """Execute one cell; returns (status, error text)."""
        self.client.timeout = int(max(1, round(timeout or self.timeout)))
        self.client.execute_cell(cell, index, store_history=history)
        return _cell_outcome(cell, self.replies.get(index), timeout or self.timeout)


def nbformat_copy(cell: NotebookNode) -> NotebookNode:
    import copy

    cell = copy.deepcopy(cell)
    cell["outputs"] = []
    return cell


def nbformat_new_cell(source: str) -> NotebookNode:
    import nbformat

    return nbformat.v4.new_code_cell(source)


def grade_notebook(
    path: str | Path,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    check_timeout: float = CHECK_TIMEOUT,
    kernel_name: str = KERNEL_NAME,
    memory_limit: int = DEFAULT_MEMORY_LIMIT,
    allow_builtins: bool = False,
    trust_notebook: bool = False,
    sandbox: bool = True,
    limits=None,
    seed: int | None = None,
) -> Grade:
    """Execute and grade one submission.

    ``memory_limit`` bytes of memory for the kernel (0: none). A solution that
    calls a reference absent from the sandbox's build scores 0; one that names the
    reference or the built-in that is the answer (the static scan) too, unless
    ``allow_builtins``, which turns a built-in into a note. The tasks are the exercise's
    released ones (`tasks_to_grade`; ``trust_notebook``: the notebook's own). Raises
    :class:`UnknownExercise` for a notebook of no released exercise, and nothing else
    because of the submission.

    ``sandbox``: the kernel runs in a bubblewrap sandbox (`attention_course.grading.isolation`)
    that sees a copy of this one notebook, and the exercise's build of the package in
    which the reference is absent (`attention_course.grading.absent`), and nothing else
    of the machine's files (``sandbox=False``: the real package, unconfined); raises
    :class:`isolation.SandboxUnavailable` when no sandbox can be made. ``limits``: the
    sandbox's `isolation.Limits` (default: ``memory_limit`` and the defaults).

    ``seed``: the run seed the checkers draw their inputs from (None: a fresh one,
    :func:`draw_seed`); the grade records it.
    """
    import nbformat
    from nbclient.exceptions import DeadKernelError

    from .cheats import allowed_names, dependencies, given_code, scan_notebook
    from .release import released_given

    path = Path(path)
    seed = draw_seed() if seed is None else int(seed)
    nb = nbformat.read(path, as_version=4)
    exercise, tasks, notes = tasks_to_grade(nb, path, trust_notebook)
    cell_index = {_nbgrader(c).get("grade_id"): i for i, c in enumerate(nb.cells)}
    cell_index.pop(None, None)
    # the exercise's given cells, as released (None: trust the notebook's own cells)
    given = None if trust_notebook else released_given().get(exercise)
    findings = scan_notebook(nb, tasks, given)  # before the run: the run adds outputs only
    needs = dependencies(nb, tasks)

    runs: dict[int, CellRun] = {}
    grades = [
        TaskGrade(
            id=t.get("id", t["name"]), kind=t["kind"], name=t["name"], points=t.get("points", 1)
        )
        for t in tasks
    ]
    scratch = package = None
    real: set[str] = set()  # the exercise's targets that are real in its build
    if sandbox and kernel_name == KERNEL_NAME:
        from . import absent, isolation

        isolation.require([path.resolve().parent])
        # the package as the sandbox sees it: only what the exercise hands out is real
        handed = given if given is not None else given_code(nb)
        package = absent.for_run().get(exercise, handed)
        real = absent.for_run().real_targets(exercise, tasks, handed)
        scratch = isolation.Scratch(path)
        limits = limits or isolation.Limits(memory=memory_limit)
    runner = _Runner(
        nb, path.parent.resolve(), timeout, kernel_name, memory_limit, scratch, limits, package
    )
    given_cells = _given_cells(nb, given)
    died: list[int] = []  # the cells that killed the kernel, in order
    from .sandbox import KernelLost, warm_up

    warming = warm_up()  # the checkers run in this process: ready them while cells run
    runner.start()
    try:
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            cell_id = cell.get("id", "")
            if runner.restarts > MAX_RESTARTS:
                runs[index] = CellRun(
                    index,
                    cell_id,
                    "not run",
                    f"the kernel died {len(died)} times (last in cell {died[-1]})",
                )
                continue
            if _is_check_cell(cell):
                runs[index] = CellRun(index, cell_id, "skipped")
                continue
            try:
                status, error = runner.run(cell, index)
            except DeadKernelError:
                how = runner.how_it_died()
                status = "died"
                error = "the kernel died while running this cell" + (f" ({how})" if how else "")
            if status == "timeout" and not runner.responsive():
                status = "died"
                error += "; it could not be interrupted (a loop in compiled code?), so the "
                error += "kernel was restarted"
            if status == "error" and index in given_cells and error.startswith(ABSENT_ERROR):
                # a given cell that shows a reference the sandbox leaves out (exercise
                # 05 prints `ac.causal_mask(4)`): not the student's problem
                status = "absent"
                # the stub's own advice ("write it yourself") is for a solution, not here
                detail = error.removeprefix(ABSENT_ERROR + ": ").split(": write it yourself")[0]
                notes.append(
                    f"given cell {index} shows the reference, which is absent while grading "
                    f"({detail}); nothing to do for the student: it is a given cell"
                )
            runs[index] = CellRun(index, cell_id, status, error)
            if status == "died":
                died.append(index)
                if runner.restarts < MAX_RESTARTS:
                    runner.restart()
                else:
                    runner.restarts += 1  # the remaining cells are not run
            elif status in ("ok", "error", "absent"):
                runner.replay.append(index)
        if runner.restarts > MAX_RESTARTS:
            runner.restart()  # the tasks are still graded, on what ran

        warming.join()
        for task, grade in zip(tasks, grades, strict=True):
            task = {**task, "allowed": allowed_names(nb, task, given), **_policy(task)}
            # in the sandbox the reference is a stub, unless the build must keep it real
            task["absent"] = scratch is not None and task["name"] not in real
            try:
                result = _grade_task(runner, task, check_timeout, seed)
            except KernelLost as error:
                if error.reason == "died":
                    how = runner.how_it_died()
                    grade.reason = "not graded: the kernel died while running its check" + (
                        f" ({how})" if how else ""
                    )
                else:
                    grade.reason = (
                        "the check did not finish: ran over the time limit and the kernel "
                        "did not come back after an interrupt"
                    )
                runner.restart()  # a kernel lost in a check costs that task only
                continue
            _fill(grade, task, "ok", "", result, nb, cell_index, runs)
            _apply_findings(
                grade,
                findings.get(grade.id, []),
                result,
                allow_builtins,
                task.get("forbidden"),
                sandboxed=scratch is not None,
            )
            _blame_dead_cells(grade, needs.get(grade.id, set()), died, runs)
    finally:
        runner.stop()
        if scratch is not None:
            scratch.remove()

    if runner.leftovers:
        notes.append(
            f"{runner.leftovers} process(es) the notebook started (a daemon, a pool) were "
            "still running when it was graded; the sandbox ended them"
        )
    cells = [runs[i] for i in sorted(runs)]
    return Grade(str(path), exercise, grades, cells, timeout, notes, scratch is not None, seed=seed)


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
        why = _why_missing(task, nb, cell_index, runs)
        found = _ABSENT.search(why)
        if found:  # its cell stopped at a reference that is absent (a class built on it)
            why += f"\nit uses {found.group(1)}, {ABSENT_REASON}"
        grade.reason = f"`{grade.name}` is not defined" + why
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
    absent = [r for r in failing if _ABSENT.search(r["message"] or "")]
    if absent:
        # It called a reference that the sandbox leaves out (a stub there): the work is
        # not the notebook's own, whatever the other cases gave.
        name = _ABSENT.search(absent[0]["message"]).group(1)
        lost = grade.score
        grade.score, grade.fraction, grade.passed = 0.0, 0.0, False
        from .absent import SERVED

        advice = (
            "it is given for another task, and what it makes holds this task's answer: "
            "write this task's code yourself"
            if any(path.endswith("." + name.rsplit(".", 1)[-1]) for path in SERVED)
            else "write it yourself"
        )
        grade.reason = (
            f"calls {name}, {ABSENT_REASON}: {advice} "
            f"({len(absent)} of {len(report['results'])} cases reached it, first "
            f"{absent[0]['name']})"
            + (f"\n(the other cases alone would give {lost:g}/{grade.points:g})" if lost else "")
        )
        return
    if failing:
        # The whole message, not only its first line: the lines below it name the
        # mistake ("Likely mistake: ...", "Hint: ...") or the line of code that raised.
        first = failing[0]
        message = (first["message"] or "").strip()
        grade.reason = first["name"] + (f": {message}" if message else "")


ABSENT_ERROR = "NotAvailableWhileGrading"  # what a stub of the sandbox's build raises
_ABSENT = re.compile(r"(attention_course[\w.]*) is not available while grading")
ABSENT_REASON = "which is not available while grading"  # in a reason: it reached a stub


def _given_cells(nb: NotebookNode, given: dict | None) -> set[int]:
    """The code cells the exercise gives verbatim: every top-level statement is one the
    released student copy has (``given``'s ``statements``); without a record (an
    instructor's notebook), the cells that are neither solution nor check cells."""
    from .absent import parse
    from .cheats import _source, _statement_hash

    out = set()
    for index, cell in enumerate(nb.cells):
        meta = _nbgrader(cell)
        if cell.cell_type != "code" or meta.get("solution") or meta.get("grade"):
            continue
        if given is None:
            out.add(index)
            continue
        try:
            body = parse(_source(cell)).body
        except (SyntaxError, ValueError):
            continue
        statements = set(given.get("statements", ()))
        if body and all(_statement_hash(node) in statements for node in body):
            out.add(index)
    return out


def _apply_findings(
    grade: TaskGrade,
    findings: list,
    result: dict | None,
    allow_builtins: bool,
    forbidden: Sequence[str] | None = None,
    sandboxed: bool = True,
) -> None:
    """Apply the task's one policy to what the static scan found
    (`attention_course.checks._scan`), as the check cell does (`checks._policy`).

    Only what the policy forbids costs points: a reference the exercise does not hand out
    (its own target always), and a built-in the task's checker declares as its answer
    (``forbidden`` is the task's record; None: every answer built-in is forbidden;
    ``allow_builtins`` makes those notes too). Everything else the scan sees (``exec``, an
    import by a computed name, a profile hook, a name of the grader's own modules) is a
    note for the instructor, not a zero: in the sandbox the references are absent, so
    whatever such code reaches is graded by what it does (a stub reached scores 0 as
    "not available while grading"). Without the sandbox (``sandboxed=False``) the
    references are present, and the note says so."""
    from ..checks._policy import breaks_policy

    findings = list(findings)
    if not findings:
        return
    grade.findings = [f.to_dict() for f in findings]
    record = None if forbidden is None else list(forbidden)  # None: all answer built-ins
    denied = []
    for finding in findings:
        if finding.kind == "builtin":
            if record is not None and not breaks_policy(finding, record):
                grade.notes.append(finding.message() + " (a note: the task does not forbid it)")
            elif allow_builtins:
                grade.notes.append(finding.message() + " (allowed by --allow-builtins)")
            else:
                denied.append(finding)
        elif breaks_policy(finding, record or []):
            denied.append(finding)
        else:
            grade.notes.append(
                finding.message()
                + (
                    " (a note for the instructor: in the sandbox the references are absent, "
                    "so it was graded by what it does)"
                    if sandboxed
                    else " (a note for the instructor: graded WITHOUT the sandbox, where the "
                    "references are present, so this may reach one: read the code)"
                )
            )
    if denied:
        lost = grade.score
        grade.score, grade.fraction, grade.passed = 0.0, 0.0, False
        text = "\n".join(f.message() for f in denied)
        absent = ABSENT_REASON in grade.reason  # 0 already: it called a stub
        if (grade.report is None or absent) and grade.reason:  # keep why, add the findings
            grade.reason += "\n" + text
            return
        grade.reason = (
            "not the student's own code: "
            + text
            + (f"\n(the checks alone would give {lost:g}/{grade.points:g})" if lost else "")
        )


def _blame_dead_cells(
    grade: TaskGrade, needed: set[int], died: list[int], runs: dict[int, CellRun]
) -> None:
    """Name, in the reason of a task that lost points, the cells it needs that killed
    the kernel (a definition made there was lost with the kernel)."""
    if grade.passed:
        return
    for index in died:
        if index in needed and f"cell {index}" not in grade.reason:
            run = runs[index]
            grade.reason += (
                f"\ncell {index} ({run.id}), which this task needs, killed the kernel: {run.error}"
            ).removeprefix("\n" if not grade.reason else "")


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
    if run.status == "died":
        return f" (cell {index}, which defines it, killed the kernel: {run.error})"
    return f" (cell {index}, which defines it, was {run.status}: {run.error})"


# ---------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the ``grade`` command line (shared by the CLI and ``python -m``)."""
    parser.add_argument(
        "submission",
        type=Path,
        nargs="+",
        metavar="DIR_OR_FILES",
        help="submitted notebooks, or folders: every *.ipynb under them is graded",
    )
    parser.add_argument(
        "--json", action="store_true", help="print a JSON document instead of the table"
    )
    add_timeout_argument(parser, DEFAULT_TIMEOUT, "for each cell of the submission")
    parser.add_argument(
        "--jobs", type=int, default=1, metavar="N", help="grade N notebooks at once (default 1)"
    )
    parser.add_argument("--csv", type=Path, metavar="FILE", help="write a gradebook (CSV)")
    parser.add_argument("--junit", type=Path, metavar="FILE", help="write JUnit XML")
    parser.add_argument(
        "--memory-limit",
        type=parse_size,
        default=DEFAULT_MEMORY_LIMIT,
        metavar="SIZE",
        help="memory each kernel may use (RLIMIT_DATA), e.g. 4G, 512M; 0 for no limit (default 4G)",
    )
    parser.add_argument(
        "--allow-builtins",
        action="store_true",
        help="a PyTorch built-in that is the answer, or a dynamic import, gives a note "
        "instead of 0 points (calling the reference always gives 0)",
    )
    parser.add_argument(
        "--trust-notebook",
        action="store_true",
        help="grade the tasks listed in the notebook's own metadata (an instructor's own "
        "notebook; a student can edit that list). Without it the exercise's released list "
        "is used, and a notebook of an unknown exercise is an error (exit 2)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar when grading several"
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="write each submission's result (DIR/<student>-<hash>.json) and feedback "
        "(.md) as soon as it is graded; merge folders with `attention-course gradebook`",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="with --out: skip submissions whose result is there for the same file content",
    )
    parser.add_argument(
        "--exercise",
        metavar="NN",
        help="the exercise expected (e.g. 05 or 05_masking): a submission of another "
        "exercise is reported, not graded",
    )
    parser.add_argument(
        "--roster",
        type=Path,
        metavar="CSV",
        help="a CSV with columns file,student: the student column of the gradebook "
        "(default: the file name without .ipynb)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        metavar="N",
        help="the run seed (>= 1) the checks draw their inputs from (default: a fresh one "
        "per run, recorded in each result; give a recorded one to reproduce a run)",
    )
    parser.add_argument(
        "--no-sandbox",
        action="store_true",
        help="run kernels without the bubblewrap sandbox (an instructor's own quick run, "
        "never for credit: every line printed says so)",
    )


def _grade_entry(path: Path, args: argparse.Namespace):
    """Read, check and grade one submission; an unreadable one is an entry with its error."""
    import nbformat

    from .gradebook import Entry

    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as err:  # noqa: BLE001 - missing file, not JSON, JSON but not a notebook
        return Entry(path, error=f"cannot read {path}: {type(err).__name__}: {err}")
    trust = getattr(args, "trust_notebook", False)
    try:
        key, tasks, _ = tasks_to_grade(nb, path, trust)
    except UnknownExercise as err:
        return Entry(path, error=str(err))
    if not tasks:
        return Entry(path, error=f"{path} lists no exercise tasks")
    expected = getattr(args, "exercise", None)
    if expected and not (key == expected or key.startswith(f"{expected}_")):
        return Entry(
            path, error=f"{path} is exercise {key}, not the expected {expected}: not graded"
        )
    grade = grade_notebook(
        path,
        timeout=args.timeout,
        memory_limit=args.memory_limit,
        allow_builtins=args.allow_builtins,
        trust_notebook=trust,
        sandbox=not getattr(args, "no_sandbox", False),
        seed=getattr(args, "seed", None),
    )
    return Entry(path, grade)


def _grade_student(path: Path, args: argparse.Namespace, roster: dict, results):
    """One unit of work: the stored result when ``--resume`` finds it, else a grade."""
    from .gradebook import digest

    student = roster.get(path.name, "")
    if results is not None and getattr(args, "resume", False):
        done = results.done(path, student)
        if done is not None:
            return done
    before = digest(path)
    entry = _grade_entry(path, args)
    entry.student, entry.digest = student or entry.student, before
    return entry


def _emit(text: str, args: argparse.Namespace, **kwargs) -> None:
    """Print ``text``; with ``--no-sandbox``, every line says that it is not for credit
    (JSON stays JSON: each grade has ``"sandboxed": false``, and stderr says it)."""
    if getattr(args, "no_sandbox", False) and getattr(args, "json", False):
        from .isolation import NO_SANDBOX_WARNING

        print(f"{NO_SANDBOX_WARNING} every grade below", file=sys.stderr)
    elif getattr(args, "no_sandbox", False):
        from .isolation import NO_SANDBOX_WARNING

        text = "\n".join(f"{NO_SANDBOX_WARNING} {line}" for line in text.split("\n"))
    print(text, **kwargs)


def _require_sandbox(args: argparse.Namespace) -> str:
    """Why the grader refuses to grade (empty when the sandbox holds, or ``--no-sandbox``)."""
    if getattr(args, "no_sandbox", False):
        return ""
    from . import isolation

    hidden = [p.resolve() for p in args.submission]
    hidden += [Path(p).resolve() for p in (args.csv, args.junit, getattr(args, "out", None)) if p]
    try:
        isolation.require(hidden)
    except isolation.SandboxUnavailable as error:
        return (
            f"grade: refusing to grade for credit without a sandbox: {error}\n"
            f"grade: {isolation.INSTALL_HINT}"
        )
    return ""


def run(args: argparse.Namespace) -> int:
    """Carry out a parsed ``grade`` command; return the exit status."""
    if getattr(args, "seed", None) is not None and args.seed < 1:
        print(
            "grade: --seed must be >= 1 (seed 0 draws the check cells' inputs, which every "
            "student has seen)",
            file=sys.stderr,
        )
        return 2
    if missing_tools("grade", sys.stderr):
        return 2
    refused = _require_sandbox(args)
    if refused:
        print(refused, file=sys.stderr)
        return 2
    from . import gradebook

    if getattr(args, "seed", None) is None:
        args.seed = draw_seed()  # one fresh seed for the whole run, recorded in each result
    if not getattr(args, "no_sandbox", False):
        from . import absent

        absent.prepare()  # the package parsed once, before the grading threads start
    paths, skipped = gradebook.find_files(args.submission)
    roster = gradebook.read_roster(args.roster) if getattr(args, "roster", None) else {}
    results = gradebook.Results(args.out) if getattr(args, "out", None) else None
    single = (
        len(args.submission) == 1
        and not args.submission[0].is_dir()
        and not (args.csv or args.junit)
    )
    if single:
        entry = _grade_student(paths[0], args, roster, results)
        if results is not None:
            results.write(entry)
        if entry.grade is None:
            print(f"grade: {entry.error}", file=sys.stderr)
            return 2
        if args.json:
            _emit(json.dumps(entry.grade.to_dict(), indent=2, ensure_ascii=False), args)
        else:
            _emit(entry.grade.table(), args)
        return 0 if entry.grade.passed else 1
    if not paths:
        print("grade: no *.ipynb found", file=sys.stderr)
        return 2
    entries = gradebook.grade_all(
        paths,
        lambda path: _grade_student(path, args, roster, results),
        jobs=args.jobs,
        progress=not args.no_progress,
        done=results.write if results is not None else None,
    )
    entries += [
        gradebook.Entry(p, error=f"skipped: {p.name} is not a notebook (*.ipynb)") for p in skipped
    ]
    return _report(entries, args)


def _report(entries: list, args: argparse.Namespace) -> int:
    """Write the CSV and JUnit, print the tables (or JSON) and the summary; the status."""
    from . import gradebook

    if args.csv:
        with open(args.csv, "w", newline="", encoding="utf-8") as stream:
            gradebook.write_csv(entries, stream)
    if args.junit:
        Path(args.junit).write_text(gradebook.junit_xml(entries), encoding="utf-8")
    if args.json:
        _emit(json.dumps(gradebook.to_json(entries), indent=2, ensure_ascii=False), args)
    else:
        for entry in entries:
            if entry.grade is not None:
                _emit(entry.grade.table(), args, end="\n\n")
        _emit(gradebook.summary_text(entries), args)
    if any(e.grade is None and not e.error.startswith("skipped:") for e in entries):
        return 2
    return 0 if all(e.grade.passed for e in entries if e.grade is not None) else 1


def add_gradebook_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the ``gradebook`` command line: merge result folders."""
    parser.add_argument(
        "results",
        type=Path,
        nargs="+",
        metavar="DIR_OR_JSON",
        help="folders written by `grade --out` (or their JSON files)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print a JSON document instead of the tables"
    )
    parser.add_argument("--csv", type=Path, metavar="FILE", help="write a gradebook (CSV)")
    parser.add_argument("--junit", type=Path, metavar="FILE", help="write JUnit XML")


def run_gradebook(args: argparse.Namespace) -> int:
    """Carry out ``attention-course gradebook``: the outputs of one class run, from the
    results that many runs (machines, array jobs) wrote."""
    from . import gradebook

    entries = gradebook.load_results(args.results)
    if not entries:
        print("gradebook: no results (*.json) found", file=sys.stderr)
        return 2
    args.no_sandbox = not all(e.grade.sandboxed for e in entries if e.grade)
    return _report(entries, args)


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
