"""Case inputs follow a run seed (issue 25, section 2).

Every input a checker draws follows the *run seed* (`attention_course.checks._data`):
seed 0, the check cells' default, draws what the checkers have always drawn, so the
committed notebooks do not change; the grader draws a fresh seed for each run, so a table
of the check cell's outputs keyed on its inputs fails there (`test_grader_seed.py`).

A verdict must not depend on the seed: the reference and every catalogue mistake of every
checker (``tests/buggy``) get the same pass/fail in every case, their catalogue phrase, and
the same first failing case with the same diagnosis (the grader's reason) under each of
``SEEDS`` (four fixed, two drawn afresh on each run and printed on a failure), and every
solved twin's tasks pass under each of them.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
from pathlib import Path

import pytest
import torch

from attention_course.checks import CHECKERS
from attention_course.checks._data import case_seed, drawing_from, randn, run_seed
from attention_course.quiz import check_quiz

sys.path.insert(0, os.path.dirname(__file__))
from buggy import CATALOGUE, REFERENCES, names  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SEEDS = [0, 1, 2, 12345, *(secrets.randbelow(2**31 - 1) + 1 for _ in range(2))]


def _diagnosis(message: str) -> list[str]:
    """The lines of a failed case's message that name the mistake (numbers blanked: they
    are the drawn values, which differ from seed to seed)."""
    lines = [
        line.strip()
        for line in message.splitlines()
        if line.strip().startswith(("Likely mistake", "Hint:", "- "))
    ]
    return [re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "#", line) for line in lines]


def _verdicts(report) -> tuple:
    """Pass/fail per case, and the first failing case with its diagnosis: what the grader
    gives as the reason, and the feedback as the mistake to fix. (The diagnoses of the
    later failing cases may name one mistake on one draw and "one of these" on another,
    where two mistakes give the same output.)"""
    failing = [r for r in report.results if not r.passed]
    first = (failing[0].name, _diagnosis(failing[0].message)) if failing else None
    return [(r.name, r.passed) for r in report.results], first


# ---------------------------------------------------------------- the run seed


def test_seed_zero_draws_what_the_check_cells_always_drew():
    assert run_seed() == 0
    expected = torch.randn((3, 4), generator=torch.Generator().manual_seed(18), dtype=torch.float64)
    assert torch.equal(randn(3, 4, seed=18), expected)
    with drawing_from(0):
        assert case_seed(18) == 18


def test_another_seed_draws_other_inputs_and_restores_seed_zero():
    with drawing_from(7):
        assert run_seed() == 7
        fresh = randn(3, 4, seed=18)
        assert case_seed(18) != 18 and case_seed(18) != case_seed(19)
        with drawing_from(8):
            assert not torch.equal(randn(3, 4, seed=18), fresh)
        assert torch.equal(randn(3, 4, seed=18), fresh)  # the same seed, the same inputs
    assert run_seed() == 0
    assert not torch.equal(fresh, randn(3, 4, seed=18))


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_a_seed_is_an_int_at_least_zero(bad):
    with pytest.raises(ValueError, match="seed"):
        CHECKERS["soft_argmax"](REFERENCES["soft_argmax"], seed=bad)


def test_every_drawn_input_follows_the_seed():
    """A candidate that records what it is called with sees other inputs under another
    seed in every case of a checker whose inputs are all drawn (soft_argmax), and the
    same inputs under the same seed."""
    from attention_course import soft_argmax

    def recorded(seed):
        calls = []

        def spy(scores, beta=1.0, dim=-1):
            calls.append(scores.detach().clone())
            return soft_argmax(scores, beta=beta, dim=dim)

        assert CHECKERS["soft_argmax"](spy, seed=seed).passed
        return calls

    zero, again, other = recorded(0), recorded(0), recorded(SEEDS[4])
    assert len(zero) == len(other) >= 10
    assert all(torch.equal(a, b) for a, b in zip(zero, again, strict=True))
    assert not any(torch.equal(a, b) for a, b in zip(zero, other, strict=True))


def test_the_global_rng_follows_the_seed_too():
    """Dropout draws from the global RNG, which `run_cases` seeds from the run seed."""
    from attention_course.checks._runner import Case, run_cases

    def draws():
        seen = []
        run_cases("x", [Case("draw", lambda: seen.append(torch.rand(3)))], 10.0)
        return seen[0]

    with drawing_from(5):
        five = draws()
    assert torch.equal(draws(), draws()) and not torch.equal(draws(), five)


# ---------------------------------------------------------------- verdicts and seeds


def _entries(target):
    reference = [(target, "the reference", REFERENCES[target], None)]
    return reference + [entry for entry in CATALOGUE if entry[0] == target]


@pytest.mark.parametrize("target", sorted(REFERENCES))
def test_verdicts_do_not_depend_on_the_seed(target):
    """The reference passes, and each mistake fails the same cases, with its catalogue
    phrase and the same first failure and diagnosis, under every seed of ``SEEDS``."""
    problems = []
    for _, name, impl, phrase in _entries(target):
        first = None
        for seed in SEEDS:
            report = CHECKERS[target](impl, seed=seed)
            if name == "the reference" and not report.passed:
                problems.append(f"the reference fails under seed {seed}:\n{report}")
            if not names(report, phrase):
                problems.append(f"{name}: {phrase!r} missing under seed {seed}:\n{report}")
            verdicts = _verdicts(report)
            if first is None:
                first = (seed, verdicts)
            elif verdicts != first[1]:
                changed = [
                    f"  {a[0]}: seed {first[0]} {a[1]} / seed {seed} {b[1]}"
                    for a, b in zip(first[1][0], verdicts[0], strict=True)
                    if a != b
                ]
                if verdicts[1] != first[1][1]:
                    changed.append(
                        f"  first failure: seed {first[0]} {first[1][1]}"
                        f" / seed {seed} {verdicts[1]}"
                    )
                problems.append(f"{name}: verdicts differ\n" + "\n".join(changed))
    assert not problems, f"seeds {SEEDS}:\n" + "\n".join(problems)


def _solved_twin(path: Path) -> tuple[list[dict], dict]:
    """The tasks of a solved twin and the namespace its cells make, run up to the last
    solution cell (the check cells skipped)."""
    from IPython.core.inputtransformer2 import TransformerManager

    nb = json.loads(path.read_text(encoding="utf-8"))
    tasks = nb["metadata"]["attention_course"]["tasks"]
    solutions = {t["solution_cell"] for t in tasks}
    checks = {t.get("check_cell") for t in tasks}
    ids = [c["metadata"].get("nbgrader", {}).get("grade_id") for c in nb["cells"]]
    last = max(i for i, grade_id in enumerate(ids) if grade_id in solutions)
    namespace: dict = {"__name__": "__main__"}
    transform = TransformerManager().transform_cell
    for index, cell in enumerate(nb["cells"][: last + 1]):
        if cell["cell_type"] == "code" and ids[index] not in checks:
            source = transform("".join(cell["source"]))
            exec(compile(source, f"{path.name} cell {index}", "exec"), namespace)
    return tasks, namespace


TWINS = sorted((ROOT / "exercises" / "solutions").glob("[0-9]*.ipynb"))


@pytest.mark.parametrize("path", TWINS, ids=[p.stem for p in TWINS])
def test_solved_twins_pass_under_every_seed(path, monkeypatch):
    pytest.importorskip("IPython")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    with torch.random.fork_rng():
        tasks, namespace = _solved_twin(path)
    failed = []
    for task in tasks:
        candidate = namespace[task["name"]]
        for seed in SEEDS:
            if task["kind"] == "quiz":
                report = check_quiz(task["question"], candidate, seed=seed)
            else:
                report = CHECKERS[task["checker"].removeprefix("check_")](candidate, seed=seed)
            if not report.passed:
                failed.append(f"{task['name']} under seed {seed}:\n{report}")
    assert not failed, f"seeds {SEEDS}:\n" + "\n".join(failed)


@pytest.mark.parametrize("seed", [0, 100, 227135218])
def test_induction_scores_tells_first_sequence_from_max_over_batch(seed):
    """Under run seeds 100 and 227135218 the random case's sequence 0 was the best on every
    head, so "the first sequence only" and "the max over the batch" gave the same scores and
    the diagnosis named both (a CI failure of test_verdicts_do_not_depend_on_the_seed, about
    one run seed in 150); the case is now redrawn until they differ."""
    for name, phrase in (
        ("max over batch", "max over the batch"),
        ("first sequence", "first sequence of the batch"),
    ):
        impl = next(f for t, n, f, _ in CATALOGUE if t == "induction_scores" and n == name)
        report = CHECKERS["induction_scores"](impl, seed=seed)
        first = next(r for r in report.results if not r.passed)
        assert first.name.startswith("random causal weights"), (name, first.name)
        assert phrase in first.message and "one of several" not in first.message, (
            name,
            first.message,
        )
