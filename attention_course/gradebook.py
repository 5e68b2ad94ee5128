"""Grade many submissions: a gradebook (CSV), JUnit XML, JSON, and a per-task summary.

``attention-course grade DIR_OR_FILES... --jobs N --csv FILE --junit FILE`` grades every
``*.ipynb`` under the given folders (and the files given), ``N`` kernels at a time, with
a progress bar on stderr. The summary per task gives the mean score, how many passed,
and the mistakes the checkers named most often ("Likely mistake: ..." lines): the
class's misconceptions at a glance.
"""

from __future__ import annotations

import csv
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree as ET

from .grading import Grade

MISTAKE = re.compile(r"^\s*Likely mistake:\s*(.+?)\s*$", re.MULTILINE)


@dataclass
class Entry:
    """One submission: its grade, or why it could not be graded."""

    path: Path
    grade: Grade | None = None
    error: str = ""


def find_submissions(paths: Iterable[Path]) -> list[Path]:
    """The files given and every ``*.ipynb`` under the folders given (sorted, no
    checkpoints), without duplicates."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        else:
            found.append(path)
    seen: set[Path] = set()
    return [p for p in found if not (p.resolve() in seen or seen.add(p.resolve()))]


def grade_all(
    paths: Sequence[Path],
    grade_one: Callable[[Path], Entry],
    jobs: int = 1,
    progress: bool = True,
) -> list[Entry]:
    """``grade_one`` on every path, ``jobs`` at a time (each starts its own kernel, a
    separate process, so threads suffice); entries in the order of ``paths``."""
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
    """One row per submission: file, exercise, total, max, one column per task, error."""
    tasks = task_names(entries)
    key = _keyer(entries)
    writer = csv.writer(stream)
    writer.writerow(["file", "exercise", "total", "max", *tasks, "error"])
    for entry in entries:
        grade = entry.grade
        if grade is None:
            writer.writerow([str(entry.path), "", 0, "", *[""] * len(tasks), entry.error])
            continue
        scores = {key(grade, t): f"{t.score:g}" for t in grade.tasks}
        writer.writerow(
            [
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
    """Per task: mean score, points, how many passed, and the most common named mistakes
    (grouped by their "Likely mistake:" line, every failing case of every submission)."""
    out = []
    key = _keyer(entries)
    for name in task_names(entries):
        grades = [t for e in entries if e.grade for t in e.grade.tasks if key(e.grade, t) == name]
        mistakes: Counter[str] = Counter()
        for task in grades:
            named = set()  # one count per submission per mistake
            for result in (task.report or {}).get("results", []):
                if not result["passed"]:
                    named.update(MISTAKE.findall(result.get("message") or ""))
            if not task.report:
                named.update(MISTAKE.findall(task.reason))
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
            }
        )
    return out


def summary_text(entries: Sequence[Entry]) -> str:
    lines = []
    graded = [e for e in entries if e.grade]
    lines.append(
        f"{len(entries)} submissions, {len(graded)} graded"
        + (
            f", {len(entries) - len(graded)} could not be read"
            if len(graded) < len(entries)
            else ""
        )
    )
    for entry in entries:
        if entry.grade:
            lines.append(f"  {entry.grade.score:g}/{entry.grade.max_score:g}  {entry.path}")
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
    return "\n".join(lines)


def to_json(entries: Sequence[Entry]) -> dict:
    return {
        "submissions": [
            e.grade.to_dict() if e.grade else {"notebook": str(e.path), "error": e.error}
            for e in entries
        ],
        "summary": summary(entries),
    }
