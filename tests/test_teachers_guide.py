"""The teacher's guide quotes the book's size and a schedule of estimated hours: each number
is recomputed here from the chapters and the released task lists, so an edit that changes them
fails until the guide is updated (the failure prints the rows to write)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "book" / "teachers_guide.md"
TASKS = json.loads((ROOT / "attention_course" / "exercise_tasks.json").read_text())

# The guide's estimates: 100 words of prose a minute; 30 minutes a coding task, 10 a question.
WORDS_PER_MINUTE = 100
HOURS = {"check": 0.5, "quiz": 1 / 6}
WEEKS = [
    ["00", "01", "02"],
    ["03", "04"],
    ["05", "06"],
    ["07", "08"],
    ["09"],
    ["10"],
    ["11"],
    ["12"],
    ["13"],
    ["14"],
    ["15", "16"],
    ["17"],
    ["18", "19"],
    ["20", "21"],
    ["22", "23"],
]


def _words(number: str) -> int:
    (path,) = ROOT.glob(f"book/{number}_*.ipynb")
    cells = json.loads(path.read_text())["cells"]
    prose = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return len(re.findall(r"[A-Za-z]+", prose))


def _task_hours(number: str) -> float:
    tasks = next((t for stem, t in TASKS.items() if stem.startswith(number + "_")), [])
    return sum(HOURS[t["kind"]] for t in tasks)


def test_the_schedule_matches_the_chapters_and_tasks():
    text = GUIDE.read_text(encoding="utf-8")
    shown = re.findall(r"^\| (\d+) \|.*\| ([\d.]+) h \| ([\d.]+) h \|$", text, re.M)
    expected = [
        (
            str(week),
            f"{sum(_words(c) for c in chapters) / WORDS_PER_MINUTE / 60:.1f}",
            f"{sum(_task_hours(c) for c in chapters):.1f}",
        )
        for week, chapters in enumerate(WEEKS, 1)
    ]
    assert shown == expected, f"the schedule's (week, reading, exercises) should be {expected}"


def test_the_size_of_the_book_is_stated_as_it_is():
    text = GUIDE.read_text(encoding="utf-8")
    words = sum(_words(f"{n:02d}") for n in range(24))
    assert f"about {round(words, -3):,} words" in text, f"{words} words of prose"
    tasks = sum(len(t) for t in TASKS.values())
    assert f"{len(TASKS)} exercise sets" in text and f"{tasks} graded tasks" in text
