"""One policy per task, enforced the same way by the check cell and by the grader.

A task's policy is one record (:func:`policy_record`, from the task's checker): the
built-ins it forbids (``forbidden``: the dotted paths the checker declares with
``@checker(..., answer_builtins=...)``, the built-ins that *are* the answer; a checker with
``forbid=False`` makes them notes for the instructor only), and the building blocks the
exercise gives (its released ``exercise_given.json`` record: what its given cells import;
any other reference, and always the package's own reference of the task's target, is not
allowed: exercise 14's task 1 may not call the package's ``apply_rope``, even though the
notebook imports it for task 4). The task's statement quotes the forbidden built-ins
(`tests/test_policy.py` checks that).

Both sides run the same static scan (`attention_course.checks._scan`) over the code
the notebook defines:

* the check cell, on the cells the kernel ran (IPython's ``In``): a solution that uses a
  forbidden built-in, or a reference the exercise does not hand out, fails with one case
  saying which line, and scores 0;
* the grader (`attention_course.grading.grade`), on the submitted notebook's cells, with
  the same record: the same finding, the same message, 0 points.

Outside a notebook (a candidate from a module, as in the tests) the check cell has no
cells to scan and the policy is the grader's alone.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from types import SimpleNamespace


def policy_record(checker: object) -> dict:
    """The task's policy, as the grader (``grade._policy``) and the check cell read it
    from the task's checker: ``{"answer_builtins": [...], "forbidden": [...]}`` (the
    built-ins that are the answer, and those of them the task forbids: all, or none for a
    checker with ``forbid=False``, whose uses are notes for the instructor)."""
    answers = sorted(getattr(checker, "answer_builtins", ()))
    return {
        "answer_builtins": answers,
        "forbidden": answers if getattr(checker, "forbid", True) else [],
    }


def breaks_policy(finding: object, forbidden: Sequence[str]) -> bool:
    """Whether a static finding costs the task its points: a ``forbidden`` built-in, or a
    reference the exercise does not hand out (the scan reports only those: the task's own
    target always, a building block the given cells do not import)."""
    kind = getattr(finding, "kind", "")
    if kind == "builtin":
        return getattr(finding, "what", "") in forbidden
    return kind == "reference"


def _history() -> list[str] | None:
    """The cells the notebook's kernel ran (IPython's ``In``); None outside a notebook."""
    main = sys.modules.get("__main__")
    history = getattr(main, "In", None)
    if not isinstance(history, list) or not all(isinstance(s, str) for s in history):
        return None
    return list(history)


def _given(target: str) -> dict | None:
    """What the exercise whose task ``target`` is hands out, as released (the statements its
    given cells hold verbatim, the building blocks they import): the record the grader
    uses. None when no released exercise, or more than one, has the task."""
    import json
    from importlib.resources import files

    try:
        package = files("attention_course")
        tasks = json.loads((package / "exercise_tasks.json").read_text(encoding="utf-8"))
        given = json.loads((package / "exercise_given.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    exercises = [
        key
        for key, items in tasks.items()
        if any(item.get("checker") == f"check_{target}" for item in items)
    ]
    return given.get(exercises[0]) if len(exercises) == 1 else None


def _last_binding(cells: Sequence[str], name: str) -> int | None:
    """The index of the last cell whose top-level statements bind ``name``."""
    from ._scan import _bound_names, _source, parse

    found = None
    for index, source in enumerate(cells):
        try:
            tree = parse(_source({"source": source}))
        except (SyntaxError, ValueError):
            continue
        if any(name in _bound_names(node) for node in tree.body):
            found = index
    return found


def policy_problem(
    candidate: object, target: str, forbidden: Sequence[str], class_name: str | None = None
) -> str:
    """What in the notebook's code of the task breaks its policy, as the grader would say it
    ("" when nothing does, or outside a notebook).

    The task is found by the names the notebook binds it to, as the grader finds it by the
    task's name: ``class_name`` or ``target`` (``soft_argmax = lambda ...`` and
    ``apply_rope = package_rope`` are bindings too), and the candidate's own ``__name__``
    when it was defined in the notebook under another name."""
    cells = _history()
    if cells is None:
        return ""
    from ._scan import scan_notebook

    names = [class_name or target]
    own = getattr(candidate, "__name__", None)
    if getattr(candidate, "__module__", None) == "__main__" and isinstance(own, str):
        names.append(own)
    nb = SimpleNamespace(
        cells=[{"cell_type": "code", "source": source, "metadata": {}} for source in cells]
    )
    tasks = []
    for name in dict.fromkeys(names):
        task = {"id": name, "name": name, "checker": f"check_{target}"}
        task["answer_builtins"] = forbidden
        # the cell that last bound the name is the task's solution cell, all of it, as in
        # the grader (an import there counts even when unused)
        last = _last_binding(cells, name)
        if last is not None:
            grade_id = f"solution-of-{name}"
            nb.cells[last]["metadata"] = {"nbgrader": {"solution": True, "grade_id": grade_id}}
            task["solution_cell"] = grade_id
        tasks.append(task)
    found = scan_notebook(nb, tasks, _given(target))
    bad = []
    for name in dict.fromkeys(names):
        for finding in found.get(name, []):
            if breaks_policy(finding, forbidden) and finding.message() not in [
                b.message() for b in bad
            ]:
                bad.append(finding)
    if not bad:
        return ""
    where = [f.message().replace(f"(cell {f.cell}, ", f"(In [{f.cell}], ") for f in bad]
    return "; ".join(where) + (
        ". This task does not allow it: write the computation yourself (the grader gives 0 "
        "points to a solution that uses it)"
    )
