"""Four holes in `attention-course grade` (issue #17), each closed and pinned here.

1. the task list was read from the submission, which a student can edit;
2. a class built on the reference (``class LayerNorm(ac.LayerNorm): pass``) passed;
3. solution code could switch the in-kernel watch off (``sys.setprofile(None)``);
4. a standard-library wrapper (``functools.partial``, ``singledispatch``, a thread pool)
   hid the student's call of the reference.

Holes 2-4 are now closed by absence, not by a watch (issue #25): in the sandbox the
reference is a stub (`attention_course.grading.absent`), so a class built on it cannot
be defined, and a call of it by any wrapper raises NotAvailableWhileGrading
(`tests/test_absent.py` has every other way of reaching it).

The adversarial notebooks are ``tests/fixtures/adv_*.ipynb.json`` (written by
``tests/fixtures/make_adversarial.py``, function ``holes``); most put the cheat in a cell
of its own after the check cell, which the static scan did not read. Each was a false pass
before (full or inflated marks); each now scores 0 on the cheating task with the reason
named, while the solved twin it was made from keeps full marks. Static checks need no
kernel; each notebook that does is graded once, in the sandbox (bubblewrap).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from attention_course.grading import grade as grading  # noqa: E402
from attention_course.grading import isolation  # noqa: E402
from attention_course.grading.cheats import scan_notebook  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
SOLUTIONS = sorted((ROOT / "exercises" / "solutions").glob("[0-9]*.ipynb"))
SDPA = "scaled_dot_product_attention"
SDPA_REF = "attention_course.attention.scaled_dot_product_attention"
EDITED = "the notebook's task list was edited; the exercise's own list was used"
NOT_IMPLEMENTED = "implemented: not implemented yet"


def _nb(name: str):
    return nbformat.read(FIXTURES / f"{name}.ipynb.json", as_version=4)


def _copy(name: str, folder: Path) -> Path:
    path = folder / f"{name}.ipynb"
    shutil.copy(FIXTURES / f"{name}.ipynb.json", path)
    return path


# ================================================================ hole 1: the task list


def test_released_task_lists_are_what_every_solved_twin_declares():
    released = json.loads((ROOT / "attention_course" / "exercise_tasks.json").read_text())
    assert released == grading.exercise_tasks()
    assert sorted(released) == [p.stem for p in SOLUTIONS]  # exercises 1-17
    for path in SOLUTIONS:
        course = nbformat.read(path, as_version=4).metadata["attention_course"]
        assert course["exercise"] == path.stem
        assert released[path.stem] == [dict(t) for t in course["tasks"]], path.name


def test_the_task_list_ships_with_the_package():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"exercise_tasks.json"' in text.split("[tool.setuptools.package-data]")[1]


@pytest.mark.parametrize("name", ["adv_tasks_dropped", "adv_tasks_points", "adv_tasks_renamed"])
def test_an_edited_task_list_is_replaced_by_the_released_one(name):
    nb = _nb(name)
    key, tasks, notes = grading.tasks_to_grade(nb, f"{name}.ipynb")
    assert key == "04_scaled_dot_product"
    assert tasks == grading.exercise_tasks()["04_scaled_dot_product"]
    assert notes == [EDITED]
    # --trust-notebook: the notebook's own (edited) list, for an instructor's notebook
    assert grading.tasks_to_grade(nb, "x.ipynb", trust_notebook=True)[1] != tasks


def test_the_exercise_is_found_by_its_key_then_by_its_file_name():
    nb = nbformat.read(SOLUTIONS[3], as_version=4)  # 04_scaled_dot_product
    assert grading.tasks_to_grade(nb, "ada.ipynb")[2] == []  # renamed file: by its key
    del nb.metadata["attention_course"]["exercise"]
    assert grading.tasks_to_grade(nb, "04_scaled_dot_product.ipynb")[0] == SOLUTIONS[3].stem
    with pytest.raises(grading.UnknownExercise, match="--trust-notebook"):
        grading.tasks_to_grade(nb, "ada.ipynb")


@pytest.mark.slow
def test_an_unknown_exercise_exits_2_unless_the_notebook_is_trusted(tmp_path, capsys):
    path = _copy("adv_tasks_unknown", tmp_path)
    assert grading.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "cannot tell which exercise this is ('99_made_up' is not one of" in err, err


# ================================================================ static scan


def _findings(name: str, task: str) -> list:
    nb = _nb(name)
    return scan_notebook(nb, grading.tasks_to_grade(nb, f"{name}.ipynb")[1]).get(task, [])


def test_a_definition_in_a_cell_of_its_own_is_scanned():
    findings = _findings("adv_subclass_mha", "MultiHeadAttention")
    assert [(f.kind, f.what, f.code) for f in findings] == [
        (
            "reference",
            "built on attention_course.MultiHeadAttention",
            "class MultiHeadAttention(ac.MultiHeadAttention):",
        )
    ]
    assert (
        findings[0]
        .message()
        .startswith("the solution is built on the reference `attention_course.MultiHeadAttention`")
    )
    assert {f.kind for f in _findings("adv_wrap_partial", SDPA)} == {"dynamic"}


def test_a_solution_cell_without_its_metadata_is_still_scanned():
    nb = _nb("adv_subclass_layernorm")
    (cell,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "LayerNorm"]
    del cell.metadata["nbgrader"]  # the grader no longer knows it is the solution cell
    findings = scan_notebook(nb, grading.tasks_to_grade(nb, "x.ipynb")[1])["LayerNorm"]
    assert ("reference", "built on attention_course.norms.LayerNorm") in {
        (f.kind, f.what) for f in findings
    }


def test_the_static_scan_names_a_profile_hook():
    thread = _findings("adv_watch_thread", SDPA)
    assert ("watch", "threading.setprofile") in {(f.kind, f.what) for f in thread}
    watch = next(f for f in thread if f.kind == "watch")
    assert watch.message().startswith(
        "the solution installs a profile or trace hook (`threading.setprofile`)"
    )
    # spelled by a computed name: the grader cannot follow it
    off = _findings("adv_watch_off", SDPA)
    assert any(
        f.kind == "dynamic" and f.what.startswith("reads an attribute of `sys`") for f in off
    )


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ("sys.setprofile(None)", "sys.setprofile"),
        ("sys.settrace(None)", "sys.settrace"),
        ("getattr(sys, 'setprofile')(None)", "sys.setprofile"),
        ("sys.monitoring.set_events(1, 0)", "sys.monitoring"),
        ("threading.settrace(None)", "threading.settrace"),
    ],
)
def test_watch_switches_in_the_solution_cell(line, what):
    nb = nbformat.read(SOLUTIONS[3], as_version=4)
    (cell,) = [c for c in nb.cells if c.get("id") == "task1-solution"]
    cell.source = (
        "import sys\nimport threading\n\n\n"
        "def scaled_dot_product_attention(query, key, value, mask=None, dropout_p=0.0, "
        f"scale=None):\n    {line}\n    return query, None\n"
    )
    findings = scan_notebook(nb, grading.find_tasks(nb))[SDPA]
    assert [(f.kind, f.what) for f in findings] == [("watch", what)], findings


# ================================================================ graded in a kernel


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Each notebook graded once, in the sandbox, when a test first asks for it."""
    if isolation.bwrap() is None:  # pragma: no cover - CI installs bubblewrap
        pytest.skip("bubblewrap is not installed")
    cache: dict = {}

    def grade(name: str, **options):
        key = (name, tuple(sorted(options.items())))
        if key not in cache:
            if name.startswith("solutions/"):
                path = ROOT / "exercises" / f"{name}.ipynb"
            else:
                path = _copy(name, tmp_path_factory.mktemp(name))
            cache[key] = grading.grade_notebook(path, timeout=30, **options)
        return cache[key]

    return grade


def _task(grade, name):
    (task,) = [t for t in grade.tasks if t.name == name]
    return task


CHEAT = "not the student's own code: "
ABSENT = "calls attention_course.{}, which is not available while grading: write it yourself"
CALLED = ABSENT.format(SDPA)
BUILT_ON = "it uses attention_course.{}, which is not available while grading"

# fixture, cheating task, lines of its reason (each line, or the start of one)
ATTACKS = [
    ("adv_tasks_dropped", SDPA, [NOT_IMPLEMENTED]),
    ("adv_tasks_points", SDPA, [NOT_IMPLEMENTED]),
    ("adv_tasks_renamed", SDPA, [NOT_IMPLEMENTED]),
    (
        "adv_subclass_mha",
        "MultiHeadAttention",
        # the cell after the check cell that subclasses it fails (the reference is a
        # stub); the student's unsolved class is checked, and the static scan names it
        [CHEAT + "the solution is built on the reference `attention_course.MultiHeadAttention`"],
    ),
    (
        "adv_subclass_layernorm",
        "LayerNorm",
        [
            BUILT_ON.format("LayerNorm"),
            "the solution is built on the reference `attention_course.norms.LayerNorm`",
        ],
    ),
    ("adv_watch_off", SDPA, [CALLED]),
    # its worker thread swallows the stub's error (out[0] is then an IndexError); what
    # the static scan sees (a computed import, a hook) are notes for the instructor
    (
        "adv_watch_thread",
        SDPA,
        [
            "3-D inputs, T != S, d_k != d_v: scaled_dot_product_attention(query, key, value) "
            "raised IndexError"
        ],
    ),
    ("adv_wrap_partial", SDPA, [CALLED]),
    ("adv_wrap_singledispatch", SDPA, [CALLED]),
    ("adv_wrap_executor", SDPA, [CALLED]),
    ("adv_wrap_methodcaller", SDPA, [CALLED]),
    # second round: a copy of the reference's code objects, the answer by its operator
    ("adv_code_copy", SDPA, [CALLED]),
    (
        "adv_aten_sdpa",
        SDPA,
        [
            CHEAT + "the solution calls `torch.ops.aten._scaled_dot_product_attention_math`, "
            "the operator behind the built-in "
            "`torch.nn.functional.scaled_dot_product_attention`, which is the answer itself",
        ],
    ),
    (
        "adv_aten_layernorm",
        "LayerNorm",
        [
            CHEAT + "the solution calls `torch.ops.aten.layer_norm`, the operator behind the "
            "built-in `torch.nn.LayerNorm`, which is the answer itself"
        ],
    ),
]
HONEST = {
    "adv_tasks": "solutions/04_scaled_dot_product",
    "adv_watch": "solutions/04_scaled_dot_product",
    "adv_wrap": "solutions/04_scaled_dot_product",
    "adv_subclass_mha": "solutions/06_multi_head_attention",
    "adv_subclass_layernorm": "solutions/07_layernorm_batchnorm",
    "adv_code_copy": "solutions/04_scaled_dot_product",
    "adv_aten_sdpa": "solutions/04_scaled_dot_product",
    "adv_aten_layernorm": "solutions/07_layernorm_batchnorm",
}


@pytest.mark.slow
@pytest.mark.parametrize(("name", "task", "reasons"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_each_attack_scores_zero_with_a_named_reason(graded, name, task, reasons):
    grade = graded(name)
    cheat = _task(grade, task)
    assert (cheat.score, cheat.passed) == (0, False), cheat.reason
    for reason in reasons:
        assert reason in cheat.reason.splitlines() or any(
            line.startswith(reason) for line in cheat.reason.splitlines()
        ), cheat.reason
    # the other tasks, the student's own, keep their marks; the totals are the released ones
    honest = graded(next(v for k, v in HONEST.items() if name.startswith(k)))
    assert grade.max_score == honest.max_score
    assert grade.score == honest.score - cheat.points, grade.table()
    assert _own_notes(grade) == ([EDITED] if name.startswith("adv_tasks") else [])
    assert _scan_notes(cheat) == SCAN_NOTES.get(name, []), cheat.notes


# What the static scan sees that the policy does not forbid: notes for the instructor,
# never points (in the sandbox the references are absent: such code is graded by what it
# does)
SCAN_NOTE = "in the sandbox the references are absent, so it was graded by what it does)"
SCAN_NOTES = {
    "adv_watch_thread": [
        "the solution imports a module by a name computed at run time (`__import__`), "
        "which the grader cannot follow",
        "the solution installs a profile or trace hook (`threading.setprofile`)",
    ],
    "adv_watch_off": [
        "the solution imports a module by a name computed at run time (`__import__`), "
        "which the grader cannot follow",
        "the solution reads an attribute of `sys` by a computed name, which the grader "
        "cannot follow",
    ],
    **{
        name: [
            "the solution imports a module by a name computed at run time (`__import__`), "
            "which the grader cannot follow"
        ]
        for name in ("adv_wrap_partial", "adv_wrap_executor", "adv_wrap_methodcaller")
    },
}


def _scan_notes(task) -> list[str]:
    """The starts of a task's scan notes (each up to its "(cell ..." place)."""
    return [n.split(" (cell ")[0] for n in task.notes if n.endswith(SCAN_NOTE)]


def _own_notes(grade) -> list[str]:
    """The grade's notes, less those on given cells that show an absent reference."""
    return [n for n in grade.notes if not n.startswith("given cell ")]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(HONEST.values())))
def test_the_honest_twins_keep_full_marks(graded, name):
    grade = graded(name)
    assert grade.passed and grade.score == grade.max_score, grade.table()
    assert _own_notes(grade) == [] and all(not t.findings for t in grade.tasks)


@pytest.mark.slow
def test_calling_the_reference_is_denied_even_with_allow_builtins(graded):
    # --allow-builtins makes the computed import a note; the reference is still absent
    cheat = _task(graded("adv_watch_off", allow_builtins=True), SDPA)
    assert cheat.score == 0 and cheat.reason.startswith(CALLED), cheat.reason


@pytest.mark.slow
def test_a_trusted_notebook_of_an_unknown_exercise_is_graded_on_its_own_list(graded):
    grade = graded("adv_tasks_unknown", trust_notebook=True)
    assert grade.exercise == "99_made_up" and grade.passed and grade.score == 5


@pytest.mark.slow
def test_a_notebook_that_rebinds_the_grader_gains_nothing(graded):
    # a cell that no task uses rebinds `attention_course.grading.cheats.watch_calls` in the
    # kernel (where the deleted watch ran) and hands the reference over through `builtins`:
    # 5/5 once. The reference it hands over is a stub in the sandbox, so that task scores 0
    # naming it; the other two tasks are the student's own and keep their marks, and every
    # task carries the scan's note for the instructor (it names the grader's modules)
    grade = graded("adv_patch_watch")
    honest = graded(HONEST["adv_watch"])
    reason = "the notebook reaches into the grader's own code (`attention_course.grading.cheats`)"
    sdpa = _task(grade, SDPA)
    assert sdpa.score == 0 and sdpa.reason.startswith(CALLED), sdpa.reason
    assert grade.score == honest.score - sdpa.points, grade.table()
    for task in grade.tasks:
        assert any(n.startswith(reason) and n.endswith(SCAN_NOTE) for n in task.notes), task


def test_the_grader_s_modules_are_flagged_in_any_cell():
    nb = _nb("adv_patch_watch")
    findings = scan_notebook(nb, grading.find_tasks(nb))
    assert set(findings) == {SDPA, "predicted_variances", "which_bug"}
    assert {(f.kind, f.what) for f in findings["which_bug"]} == {
        ("watch", "attention_course.grading.cheats")
    }
    for source in (
        "from attention_course.grading import sandbox",
        "from attention_course import grading",
        "ac.grading.cheats.watch_calls = None",
        "m = __import__('attention_' + 'course.grading.cheats')",
    ):
        nb = nbformat.read(ROOT / "exercises" / "solutions" / "04_scaled_dot_product.ipynb", 4)
        nb.cells.insert(2, nbformat.v4.new_code_cell(source))
        findings = scan_notebook(nb, grading.find_tasks(nb))
        assert set(findings) == {SDPA, "predicted_variances", "which_bug"}, source


def test_operator_spellings_of_the_answer_are_flagged():
    from attention_course.grading.cheats import _matches_builtin

    sdpa = ("torch.nn.functional.scaled_dot_product_attention",)
    norm = ("torch.nn.LayerNorm", "torch.nn.functional.layer_norm")
    mha = ("torch.nn.MultiheadAttention", "torch.nn.functional.multi_head_attention_forward")
    assert _matches_builtin("torch.ops.aten._scaled_dot_product_flash_attention.default", sdpa)
    assert _matches_builtin("torch._scaled_dot_product_attention_math", sdpa)
    assert _matches_builtin("torch._C._nn.scaled_dot_product_attention", sdpa)
    assert _matches_builtin("torch.ops.aten.native_layer_norm", norm)
    assert _matches_builtin("torch._C._VariableFunctions.layer_norm", norm)
    assert _matches_builtin("torch._native_multi_head_attention", mha)
    for honest in ("torch.ops.aten.matmul", "torch.matmul", "torch.softmax", "torch._C._nn.linear"):
        assert _matches_builtin(honest, sdpa + norm + mha) is None, honest


# ================================================================ no false alarms

SCRATCH_CELLS = [
    "m = torch.nn.Linear(2, 2)\nm.eval()\nm.train(False)",
    "f = torch.compile(lambda x: x)",
    "import importlib\nimportlib.reload(torch)",
    "import sys\nprint(sys.version, sys.path[:1])",
    # comparing with the reference or the built-in outside the solution is allowed
    "import attention_course as ac\nprint(ac.LayerNorm(4)(torch.ones(2, 4)))",
    "print(torch.nn.functional.layer_norm(torch.ones(3, 4), (4,)))",
    "v, m = torch.var_mean(torch.ones(3, 4), dim=-1)\nprint(torch.norm(v))",
    "from attention_course.checks import check_layer_norm",
]


@pytest.mark.parametrize("source", SCRATCH_CELLS)
def test_an_honest_scratch_cell_is_not_a_finding(source):
    """A cell no task uses, doing what students do while they explore, flags nothing."""
    path = ROOT / "exercises" / "solutions" / "07_layernorm_batchnorm.ipynb"
    nb = nbformat.read(path, as_version=4)
    _, tasks, _ = grading.tasks_to_grade(nb, path)
    nb.cells.append(nbformat.v4.new_code_cell(source))
    assert scan_notebook(nb, tasks) == {}


def test_sys_modules_in_a_scratch_cell_counts_against_every_task():
    path = ROOT / "exercises" / "solutions" / "07_layernorm_batchnorm.ipynb"
    nb = nbformat.read(path, as_version=4)
    _, tasks, _ = grading.tasks_to_grade(nb, path)
    nb.cells.append(nbformat.v4.new_code_cell("import sys\nprint('torch' in sys.modules)"))
    found = scan_notebook(nb, tasks)
    assert set(found) == {t["id"] for t in tasks}
    assert all(f.kind == "dynamic" for fs in found.values() for f in fs)


# ================================================================ objects the grader sends


@pytest.mark.slow
def test_a_given_model_runs_without_its_class_imported(tmp_path):
    """Exercise 17 without the given `GPT` import (which once kept the grader from calling
    the model's forward the student's use of the reference): still full marks."""
    nb = nbformat.read(ROOT / "exercises/solutions/17_induction_heads.ipynb", as_version=4)
    edits = 0
    for cell in nb.cells:
        before = cell.source
        cell.source = cell.source.replace(
            "from attention_course import GPT, seed_everything",
            "from attention_course import seed_everything",
        ).replace("isinstance(model, GPT)", "type(model).__name__ == 'GPT'")
        edits += cell.source != before
    assert edits == 2
    path = tmp_path / "17_induction_heads.ipynb"
    nbformat.write(nb, path)
    grade = grading.grade_notebook(path, timeout=60)
    assert grade.score == grade.max_score == 9, grade.table()


FFN_BY_NAME = """class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0, activation="relu"):
        super().__init__()
        self.activation = activation
        self.linear1 = nn.Linear(d_model, d_ff)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.act = getattr(F, activation)

    def forward(self, x):
        return self.linear2(self.dropout(self.act(self.linear1(x))))
"""


def _ffn_findings(scratch: str = ""):
    path = ROOT / "exercises" / "solutions" / "08_feed_forward.ipynb"
    nb = nbformat.read(path, as_version=4)
    _, tasks, _ = grading.tasks_to_grade(nb, path)
    ffn = "PositionwiseFeedForward"
    (cell,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == ffn]
    cell.source = FFN_BY_NAME
    if scratch:
        nb.cells.append(nbformat.v4.new_code_cell(scratch))
    return scan_notebook(nb, tasks)


def test_an_activation_looked_up_by_name_is_not_a_finding():
    """``getattr(F, activation)`` is an everyday idiom (exercise 8 takes ``activation="relu"``
    or ``"gelu"``): a computed read of ``torch.nn.functional``, ``torch.nn`` or
    ``torch.nn.init`` is no finding."""
    assert _ffn_findings() == {}
    assert (
        _ffn_findings(scratch="for name in ('ReLU', 'GELU'):\n    print(getattr(nn, name)())") == {}
    )
    assert (
        _ffn_findings(
            scratch="w = torch.empty(2, 2)\ngetattr(torch.nn.init, 'xavier_' + 'uniform_')(w)"
        )
        == {}
    )


@pytest.mark.parametrize("module", ["sys", "torch", "ac"])
def test_a_computed_read_of_another_module_is_still_a_finding(module):
    found = _ffn_findings(scratch=f"import sys\nname = 'x'\nprint(getattr({module}, name))")
    assert found and all(f.kind == "dynamic" for fs in found.values() for f in fs), found


def _soft_argmax_findings(solution: str, scratch: str):
    path = ROOT / "exercises" / "solutions" / "01_attention_over_sets.ipynb"
    nb = nbformat.read(path, as_version=4)
    _, tasks, _ = grading.tasks_to_grade(nb, path)
    (cell,) = [
        c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "soft_argmax"
    ]
    cell.source = solution
    nb.cells.append(nbformat.v4.new_code_cell(scratch))
    return scan_notebook(nb, tasks).get("soft_argmax", [])


def test_a_variable_named_like_an_import_of_another_cell_is_the_functions_own():
    """A scratch cell imports ``softmax`` to compare; the solution's own variable of that
    name is not the import (Python's scoping), so it is no finding."""
    scratch = "from torch.nn.functional import softmax\nprint(softmax(torch.ones(3), -1))"
    honest = (
        "def soft_argmax(scores, beta=1.0, dim=-1):\n"
        "    e = torch.exp(beta * scores - (beta * scores).amax(dim=dim, keepdim=True))\n"
        "    softmax = e / e.sum(dim=dim, keepdim=True)\n"
        "    return softmax\n"
    )
    assert _soft_argmax_findings(honest, scratch) == []
    # a variable of another function (or method) does not hide the import
    cheat = (
        "def soft_argmax(scores, beta=1.0, dim=-1):\n"
        "    def unused():\n"
        "        softmax = 1\n"
        "        return softmax\n"
        "    return softmax(beta * scores, dim=dim)\n"
    )
    assert [(f.kind, f.what) for f in _soft_argmax_findings(cheat, scratch)] == [
        ("builtin", "torch.nn.functional.softmax")
    ]


# ================================================================ the exercise's own code


def _released(stem: str):
    from attention_course.grading.release import released_given

    path = ROOT / "exercises" / "solutions" / f"{stem}.ipynb"
    nb = nbformat.read(path, as_version=4)
    _, tasks, _ = grading.tasks_to_grade(nb, path)
    return nb, tasks, released_given()[stem]


def _replace_solution(nb, name: str, body: str) -> None:
    for cell in nb.cells:
        if cell.source.startswith(f"def {name}("):
            cell.source = body
            return
    raise AssertionError(name)


def test_the_released_given_code_is_what_every_student_copy_gives():
    from attention_course.grading.cheats import given_code
    from attention_course.grading.release import make_student_notebook, released_given

    released = released_given()
    assert sorted(released) == [p.stem for p in SOLUTIONS]
    for path in SOLUTIONS:
        student = make_student_notebook(nbformat.read(path, as_version=4))
        assert released[path.stem] == given_code(student), path.stem


def test_a_statement_the_exercise_gives_is_not_the_students_use_of_the_reference():
    """Exercise 13 gives `model = ac.GPT(...)`; a solution reading that model is honest
    (an honest-student pass found it scored 0), even with the given cell edited around it;
    the same line written by the student in another form is still the reference."""
    nb, tasks, given = _released("13_decoder_only")
    body = "def uniform_loss():\n    return math.log(model.head.out_features)\n"
    _replace_solution(nb, "uniform_loss", body)
    assert scan_notebook(nb, tasks, given) == {}
    for cell in nb.cells:  # the given cell, with a print added: the statement still counts
        if "model = ac.GPT(" in cell.source:
            cell.source += "\nprint(model)"
    assert scan_notebook(nb, tasks, given) == {}
    # a model built by the student is the reference (an edited `model = ...` line would not
    # do here: a later given cell binds `model` again, and the scan judges the last binding)
    _replace_solution(
        nb,
        "uniform_loss",
        "mine = ac.GPT(V + 0, d_model=32, num_heads=2, num_layers=1, max_len=32)\n\n"
        "def uniform_loss():\n    return math.log(mine.head.out_features)\n",
    )
    found = scan_notebook(nb, tasks, given)
    assert [f.what for f in found["uniform_loss"]] == ["attention_course.GPT"], found


def test_an_import_the_student_adds_is_not_a_building_block():
    """Exercise 6 hands out `scaled_dot_product_attention`; exercise 4 does not: importing
    it by name in an added cell does not make it one."""
    nb, tasks, given = _released("04_scaled_dot_product")
    nb.cells.insert(1, nbformat.v4.new_code_cell("from attention_course import masked_softmax"))
    _replace_solution(
        nb,
        SDPA,
        f"def {SDPA}(query, key, value, mask=None, dropout_p=0.0, scale=None):\n"
        "    s = query @ key.transpose(-2, -1) * (scale or query.size(-1) ** -0.5)\n"
        "    w = masked_softmax(s, mask)\n"
        "    return w @ value, w\n",
    )
    found = scan_notebook(nb, tasks, given)
    assert [f.what for f in found[SDPA]] == ["attention_course.masked_softmax"], found
    assert scan_notebook(nb, tasks, None) == {}  # trusting the notebook's own cells
    nb6, tasks6, given6 = _released("06_multi_head_attention")
    assert scan_notebook(nb6, tasks6, given6) == {}  # the given building block stays allowed
    from attention_course.grading.cheats import allowed_names

    names = allowed_names(nb6, tasks6[-1], given6)
    assert "scaled_dot_product_attention" in names
    assert "masked_softmax" not in allowed_names(nb, tasks[0], given)


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ("F.rms_norm(x, self.normalized_shape, self.weight, eps)", "torch.nn.functional.rms_norm"),
        ("nn.RMSNorm(self.normalized_shape, eps)(x)", "torch.nn.RMSNorm"),
    ],
)
def test_rms_norm_from_the_builtin_is_flagged(line, what):
    """Exercise 16 asks for RMSNorm from tensor operations; nn.RMSNorm had no declared
    answer built-in, so a one-line wrapper of it was not flagged."""
    nb, tasks, given = _released("16_the_modern_block")
    old = "        y = x * torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + eps)\n"
    for cell in nb.cells:
        if old in cell.source:
            cell.source = cell.source.replace(old, f"        return {line}\n")
            cell.source = "import torch.nn.functional as F\n" + cell.source
    found = scan_notebook(nb, tasks, given)
    assert [(f.kind, f.what) for f in found["RMSNorm"]] == [("builtin", what)], found
