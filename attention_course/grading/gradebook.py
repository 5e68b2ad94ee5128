"""Grade many submissions: a gradebook (CSV), JUnit XML, JSON, and a per-task summary.

``attention-course grade DIR_OR_FILES... --jobs N --csv FILE --junit FILE`` grades every
``*.ipynb`` under the given folders (and the files given; ``.IPYNB`` in any case), ``N``
kernels at a time, with a progress bar on stderr; every other file found is listed as
skipped, not dropped. The summary per task gives the mean score, how many passed, the
mistakes the checkers named most often (every "Likely mistake: ..." and "Hint: ..." line,
and the grader's own reasons: not defined, a kernel that died) and, apart, the
submissions that ran over a time limit: the class's misconceptions at a glance.

With ``--out DIR`` each submission's result is written to ``DIR/<student>.json`` (and its
feedback to ``DIR/<student>.md``) as soon as it is graded, so a crash or a kill of the
run loses nothing, ``--resume`` skips what is done, and ``attention-course gradebook
DIR...`` merges result folders (from many machines: one submission is one unit of work)
into the CSV, JUnit and summary.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree as ET

from .grade import Grade

MISTAKE = re.compile(r"^\s*(?:Likely mistake|Hint):\s*(.+?)\s*$", re.MULTILINE)
TIMED_OUT = re.compile(r"ran over the (?:CPU )?time limit|did not finish")


@dataclass
class Entry:
    """One submission: its grade, or why it could not be graded (or was skipped)."""

    path: Path
    grade: Grade | None = None
    error: str = ""
    student: str = ""  # from the roster, else the file name's stem
    digest: str = ""  # the submission's sha256 when graded (``--resume`` compares it)

    def __post_init__(self) -> None:
        self.student = self.student or Path(self.path).stem

    def to_dict(self) -> dict:
        body = self.grade.to_dict() if self.grade else {"notebook": str(self.path)}
        return {**body, "student": self.student, "sha256": self.digest, "error": self.error}

    @classmethod
    def from_dict(cls, data: dict) -> Entry:
        from .grade import Grade

        grade = Grade.from_dict(data) if "tasks" in data else None
        return cls(
            Path(data["notebook"]),
            grade,
            data.get("error", ""),
            data.get("student", ""),
            data.get("sha256", ""),
        )


def digest(path: Path) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


def is_notebook(path: Path) -> bool:
    return path.suffix.lower() == ".ipynb"


def find_files(paths: Iterable[Path]) -> tuple[list[Path], list[Path]]:
    """(the notebooks to grade, the other files found in the folders, listed as skipped):
    the files given and every ``*.ipynb`` (any case) under the folders given, sorted, no
    checkpoints or hidden files, without duplicates."""
    found: list[Path] = []
    skipped: list[Path] = []
    for path in paths:
        if path.is_dir():
            for p in sorted(path.rglob("*")):
                rel = p.relative_to(path).parts
                if not p.is_file() or ".ipynb_checkpoints" in rel or rel[-1].startswith("."):
                    continue
                (found if is_notebook(p) else skipped).append(p)
        else:
            found.append(path)
    seen: set[Path] = set()
    return [p for p in found if not (p.resolve() in seen or seen.add(p.resolve()))], skipped


def find_submissions(paths: Iterable[Path]) -> list[Path]:
    """The notebooks of :func:`find_files`."""
    return find_files(paths)[0]


def read_roster(path: Path) -> dict[str, str]:
    """A roster CSV with the columns ``file`` and ``student``: file name -> student."""
    with open(path, newline="", encoding="utf-8") as stream:
        rows = list(csv.DictReader(stream))
    if rows and not {"file", "student"} <= set(rows[0]):
        raise ValueError(f"{path}: a roster needs the columns 'file' and 'student'")
    return {Path(r["file"]).name: r["student"] for r in rows}


class Results:
    """A folder of results: ``<key>.json`` (the entry) and ``<key>.md`` (its feedback) per
    submission, written as soon as each is graded."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def key(entry_or_path, student: str = "") -> str:
        """A file name for a submission: its student, made safe, and a short hash of the
        submission's path (two files of one name in different folders differ)."""
        path = Path(getattr(entry_or_path, "path", entry_or_path)).resolve()
        name = student or getattr(entry_or_path, "student", "") or path.stem
        safe = re.sub(r"[^\w.-]+", "_", name).strip("._") or "submission"
        return f"{safe}-{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"

    def write(self, entry: Entry) -> Path:
        key = self.key(entry)
        target = self.folder / f"{key}.json"
        partial = target.with_suffix(".json.partial")
        partial.write_text(json.dumps(entry.to_dict(), indent=1, ensure_ascii=False) + "\n")
        partial.replace(target)  # atomic: a killed run leaves whole files or none
        if entry.grade is not None:
            (self.folder / f"{key}.md").write_text(feedback(entry), encoding="utf-8")
        return target

    def done(self, path: Path, student: str = "") -> Entry | None:
        """The stored entry of ``path`` when it was graded as it is now (same content)."""
        target = self.folder / f"{self.key(path, student)}.json"
        if not target.exists():
            return None
        try:
            entry = Entry.from_dict(json.loads(target.read_text(encoding="utf-8")))
        except (ValueError, KeyError, TypeError):
            return None
        return entry if entry.digest and entry.digest == digest(path) else None


def load_results(folders: Iterable[Path]) -> list[Entry]:
    """Every entry stored in the result folders (``*.json``), sorted by notebook path."""
    entries = []
    for folder in folders:
        files = [Path(folder)] if Path(folder).is_file() else sorted(Path(folder).glob("*.json"))
        for file in files:
            entries.append(Entry.from_dict(json.loads(file.read_text(encoding="utf-8"))))
    return sorted(entries, key=lambda e: str(e.path))


def grade_all(
    paths: Sequence[Path],
    grade_one: Callable[[Path], Entry],
    jobs: int = 1,
    progress: bool = True,
    done: Callable[[Entry], None] | None = None,
) -> list[Entry]:
    """``grade_one`` on every path, ``jobs`` at a time (each starts its own kernel, a
    separate process, so threads suffice); entries in the order of ``paths``. ``done``
    is called with each entry as soon as it is graded (to write it)."""
    entries: dict[Path, Entry] = {}
    bar = _progress(len(paths), progress)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(grade_one, path): path for path in paths}
        for future in as_completed(futures):
            path = futures[future]
            try:
                entries[path] = future.result()
            except Exception as error:  # noqa: BLE001 - one submission must not stop the rest
                entries[path] = Entry(path, error=f"{type(error).__name__}: {error}")
            if done is not None:
                done(entries[path])
            bar.update(1)
    bar.close()
    return [entries[p] for p in paths]


def _progress(total: int, enabled: bool):
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is optional: no bar
        enabled = False
    if not enabled:

        class _Quiet:
            def update(self, n: int) -> None:
                pass

            def close(self) -> None:
                pass

        return _Quiet()
    return tqdm(total=total, unit="notebook", file=sys.stderr, desc="grading")


# ---------------------------------------------------------------- outputs


def _keyer(entries: Sequence[Entry]) -> Callable:
    """A task's column name: its id, or ``exercise/id`` when several exercises are graded
    together (exercises 6 and 8 both have a ``parameter_count``)."""
    exercises = {e.grade.exercise for e in entries if e.grade}
    if len(exercises) <= 1:
        return lambda grade, task: task.id
    return lambda grade, task: f"{grade.exercise}/{task.id}"


def task_names(entries: Sequence[Entry]) -> list[str]:
    """Every task's column name, in the order the submissions list them."""
    key = _keyer(entries)
    names: list[str] = []
    for entry in entries:
        for task in entry.grade.tasks if entry.grade else []:
            if key(entry.grade, task) not in names:
                names.append(key(entry.grade, task))
    return names


def write_csv(entries: Sequence[Entry], stream) -> None:
    """One row per submission: student, file, exercise, total, max, one column per task,
    error (a learning-management system imports it by the student column)."""
    tasks = task_names(entries)
    key = _keyer(entries)
    writer = csv.writer(stream)
    writer.writerow(["student", "file", "exercise", "total", "max", *tasks, "error"])
    for entry in entries:
        grade = entry.grade
        if grade is None:
            writer.writerow(
                [entry.student, str(entry.path), "", 0, "", *[""] * len(tasks), entry.error]
            )
            continue
        scores = {key(grade, t): f"{t.score:g}" for t in grade.tasks}
        writer.writerow(
            [
                entry.student,
                str(entry.path),
                grade.exercise,
                f"{grade.score:g}",
                f"{grade.max_score:g}",
                *[scores.get(t, "") for t in tasks],
                "",
            ]
        )


def junit_xml(entries: Sequence[Entry]) -> str:
    """JUnit XML: a test suite per submission, a test case per task (failure = reason)."""
    suites = ET.Element("testsuites", name="attention-course grade")
    for entry in entries:
        grade = entry.grade
        suite = ET.SubElement(suites, "testsuite", name=str(entry.path))
        if grade is None:
            case = ET.SubElement(suite, "testcase", classname=str(entry.path), name="notebook")
            ET.SubElement(case, "error", message=entry.error).text = entry.error
            suite.set("tests", "1")
            suite.set("errors", "1")
            suite.set("failures", "0")
            continue
        failures = 0
        for task in grade.tasks:
            case = ET.SubElement(suite, "testcase", classname=f"{grade.exercise}", name=task.name)
            case.set("score", f"{task.score:g}")
            case.set("points", f"{task.points:g}")
            if not task.passed:
                failures += 1
                first = (task.reason.splitlines() or ["failed"])[0]
                failure = ET.SubElement(case, "failure", message=first)
                failure.text = task.reason
        suite.set("tests", str(len(grade.tasks)))
        suite.set("failures", str(failures))
        suite.set("errors", "0")
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def summary(entries: Sequence[Entry], top: int = 3) -> list[dict]:
    """Per task: mean score, points, how many passed, the most common named mistakes
    (every "Likely mistake:" and "Hint:" line of every failing case of every submission,
    and for a task that was not checked the grader's reason, its first line), and, apart,
    how many submissions ran over a time limit."""
    out = []
    key = _keyer(entries)
    for name in task_names(entries):
        grades = [t for e in entries if e.grade for t in e.grade.tasks if key(e.grade, t) == name]
        mistakes: Counter[str] = Counter()
        timeouts = 0
        for task in grades:
            named = set()  # one count per submission per mistake
            timed_out = False
            for result in (task.report or {}).get("results", []):
                if not result["passed"]:
                    message = result.get("message") or ""
                    if TIMED_OUT.search(message):
                        timed_out = True
                        continue
                    named.update(MISTAKE.findall(message))
            if not task.report and task.reason:
                if TIMED_OUT.search(task.reason):
                    timed_out = True
                else:
                    found = MISTAKE.findall(task.reason)
                    named.update(found or [_reason_head(task.reason)])
            timeouts += timed_out
            mistakes.update(named)
        out.append(
            {
                "task": name,
                "submissions": len(grades),
                "points": grades[0].points if grades else 0,
                "mean_score": round(sum(t.score for t in grades) / len(grades), 2)
                if grades
                else 0.0,
                "passed": sum(t.passed for t in grades),
                "common_mistakes": [
                    {"mistake": m, "count": c} for m, c in mistakes.most_common(top)
                ],
                "named_mistakes": sum(mistakes.values()),
                "timeouts": timeouts,
            }
        )
    return out


def _reason_head(reason: str) -> str:
    """The grader's reason without what names one notebook: "`x` is not defined"."""
    first = reason.strip().splitlines()[0]
    return re.sub(r"\s*\((?:cell|the cell) .*$", "", first)


def summary_text(entries: Sequence[Entry]) -> str:
    lines = []
    graded = [e for e in entries if e.grade]
    skipped = [e for e in entries if not e.grade and e.error.startswith("skipped:")]
    unread = len(entries) - len(graded) - len(skipped)
    lines.append(
        f"{len(entries) - len(skipped)} submissions, {len(graded)} graded"
        + (f", {unread} could not be read" if unread else "")
        + (f"; {len(skipped)} other files skipped" if skipped else "")
    )
    for entry in entries:
        if entry.grade:
            lines.append(
                f"  {entry.grade.score:g}/{entry.grade.max_score:g}  {entry.student}  {entry.path}"
            )
        else:
            lines.append(f"  not graded  {entry.path}: {entry.error}")
    lines.append("per task:")
    for row in summary(entries):
        lines.append(
            f"  {row['task']}: mean {row['mean_score']:g}/{row['points']:g}, "
            f"passed {row['passed']}/{row['submissions']}"
        )
        for mistake in row["common_mistakes"]:
            lines.append(f"      {mistake['count']} x {mistake['mistake']}")
        if row["timeouts"]:
            lines.append(f"      time-outs: {row['timeouts']} submission(s) ran over a limit")
    return "\n".join(lines)


def to_json(entries: Sequence[Entry]) -> dict:
    return {
        "submissions": [
            {**e.grade.to_dict(), "student": e.student}
            if e.grade
            else {"notebook": str(e.path), "student": e.student, "error": e.error}
            for e in entries
        ],
        "summary": summary(entries),
    }


def feedback(entry: Entry) -> str:
    """The student's feedback (Markdown): each task, its score, the first failing case
    and its diagnosis, and the first hint (the concept)."""
    from ..checks._hints import hint

    grade = entry.grade
    lines = [
        f"# {grade.exercise}: {entry.student}",
        "",
        f"Total: **{grade.score:g} / {grade.max_score:g}**",
        "",
        "| task | score |",
        "|---|---|",
    ]
    lines += [f"| `{t.name}` | {t.score:g} / {t.points:g} |" for t in grade.tasks]
    for task in grade.tasks:
        lines += ["", f"## `{task.name}`: {task.score:g} / {task.points:g}", ""]
        if task.passed:
            lines.append("Every case passed.")
        elif task.reason:
            lines += ["```", task.reason.strip(), "```"]
        failing = [r for r in (task.report or {}).get("results", []) if not r["passed"]]
        if failing and task.kind == "check":
            target = str(task.report.get("target", "")).removeprefix("check_")
            lines += ["", "Hint: " + hint(target, failing[0].get("message") or "", 1)]
        lines += [f"- note: {note}" for note in task.notes]
    if grade.notes:
        lines += ["", "## Notes", "", *[f"- {note}" for note in grade.notes]]
    if grade.seed is not None:
        lines += ["", f"The checks drew their inputs with seed {grade.seed}."]
    if not grade.sandboxed:
        lines += ["", "**Graded without the sandbox (--no-sandbox): not for credit.**"]
    return "\n".join(lines) + "\n"
