"""One policy per task, enforced the same way by the check cell and by the grader.

A task's policy is one record (:func:`policy_record`, from the task's checker): the
built-ins it forbids (``forbidden``: the dotted paths the checker declares with
``@checker(..., answer_builtins=...)``, the built-ins that *are* the answer; a checker with
``forbid=False`` makes them notes for the instructor only), and the building blocks the
exercise gives (its released ``exercise_given.json`` record: what its given cells import;
any other reference, and always the package's own reference of the task's target, is not
allowed: exercise 14's task 1 may not call the package's ``apply_rope``, even though the
notebook imports it for task 3). The task's statement quotes the forbidden built-ins
(`tests/test_policy.py` checks that).

Both sides run the same static scan (`attention_course.checks._scan`) over the code
the notebook defines:

* the check cell, on the cells the kernel ran (IPython's ``In``): a solution that uses a
  forbidden built-in, or its own target's reference, fails with one case saying which
  line, and scores 0;
* the grader (`attention_course.grading.grade`), on the submitted notebook's cells, with
  the released record: the same finding, the same message, 0 points.

Outside a notebook (a candidate from a module, as in the tests) the check cell has no
cells to scan and the policy is the grader's alone.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from types import SimpleNamespace

POLICY_KINDS = ("builtin", "reference")  # findings that cost the task its points


def policy_record(checker: object) -> dict:
    """The task's policy, as ``release`` writes it into the task's record:
    ``{"answer_builtins": [...], "forbidden": [...]}`` (the built-ins that are the answer,
    and those of them the task forbids: all, or none for a checker with ``forbid=False``,
    whose uses are notes for the instructor)."""
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


def _history(candidate: object) -> list[str] | None:
    """The cells the notebook's kernel ran (IPython's ``In``), when ``candidate`` was
    defined in one; None outside a notebook."""
    if getattr(candidate, "__module__", None) != "__main__":
        return None
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


def policy_problem(candidate: object, target: str, forbidden: Sequence[str]) -> str:
    """What in the notebook's code of ``candidate`` breaks its task's policy, as the grader
    would say it ("" when nothing does, or outside a notebook)."""
    cells = _history(candidate)
    name = getattr(candidate, "__name__", None)
    if cells is None or not isinstance(name, str):
        return ""
    from ._scan import scan_notebook

    nb = SimpleNamespace(
        cells=[{"cell_type": "code", "source": source, "metadata": {}} for source in cells]
    )
    task = {"id": name, "name": name, "checker": f"check_{target}", "answer_builtins": forbidden}
    findings = scan_notebook(nb, [task], _given(target)).get(name, []) if cells else []
    bad = [f for f in findings if breaks_policy(f, forbidden)]
    if not bad:
        return ""
    where = [f.message().replace(f"(cell {f.cell}, ", f"(In [{f.cell}], ") for f in bad]
    return "; ".join(where) + (
        ". This task does not allow it: write the computation yourself (the grader gives 0 "
        "points to a solution that uses it)"
    )
