"""The reference is absent in the sandbox, not watched (issue #25, item 2).

`attention_course.grading.absent` builds, per exercise, the package the sandbox sees:
what the exercise hands out is real, every other reference is a stub raising
NotAvailableWhileGrading. Without a kernel: every module of every build imports, what
each exercise hands out is real, the stubs refuse every use, and the targets that must
stay real are listed. With a sandboxed kernel (bubblewrap): every way of calling the
reference (`tests/fixtures/make_absent.py`: every spelling, a thread, a pool, the
profiler switched off, import hooks that rewrite the grader's server, a cell `ast`
cannot parse, the package's source copied) scores 0 on that task with the reference
named, while the other tasks keep their marks. One class run (about five minutes on
two cores, ``--jobs 2``).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attention_course.grading import absent

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
EXERCISES = sorted(p.stem for p in (ROOT / "exercises" / "solutions").glob("[0-9]*.ipynb"))
ABSENT = "calls attention_course.causal_mask, which is not available while grading"


@pytest.fixture(scope="module")
def builds():
    made = absent.Builds()
    yield made
    made.remove()


# ---------------------------------------------------------------- the builds


def test_every_module_of_every_build_imports(builds):
    """Module-level statements that call a stub would break an import: none does."""
    code = (
        "import importlib, json, pkgutil, sys\n"
        "bad = {}\n"
        "for folder in sys.argv[1:]:\n"
        "    for name in [m for m in sys.modules if m.split('.')[0] == 'attention_course']:\n"
        "        del sys.modules[name]\n"
        "    sys.path.insert(0, folder)\n"
        "    import attention_course\n"
        "    assert attention_course.__file__.startswith(folder), attention_course.__file__\n"
        "    for m in pkgutil.walk_packages(attention_course.__path__, 'attention_course.'):\n"
        "        try:\n"
        "            importlib.import_module(m.name)\n"
        "        except Exception as error:\n"
        "            bad.setdefault(folder, []).append((m.name, repr(error)))\n"
        "    sys.path.remove(folder)\n"
        "print(json.dumps(bad))\n"
    )
    folders = [str(builds.get(exercise).parent) for exercise in EXERCISES]
    done = subprocess.run(
        [sys.executable, "-c", code, *folders], capture_output=True, text=True, cwd="/"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {}


def test_what_each_exercise_hands_out_is_real_and_the_rest_is_not():
    for exercise in EXERCISES:
        plan = absent.plan(exercise)
        graph = absent._Graph(absent._read(ROOT / "attention_course"))
        for path in plan.gives:
            module, _, name = path.rpartition(".")
            found = graph.resolve(module, name)
            # what the grader serves (exercise 13's model) is a stub: it runs in the grader
            assert (found in plan.real) != (path in absent.SERVED), (exercise, path)
        # the checkers and the quiz check are never real: the grader runs them itself
        assert ("attention_course.checks.masking", "check_causal_mask") not in plan.real
        assert ("attention_course.quiz", "check_quiz") not in plan.real
        # the grader's kernel side is real in every build
        assert ("attention_course.grading.sandbox", "serve") in plan.real
        assert ("attention_course.grading._kernel", "main") in plan.real
    # exercise 5 hands out get_device and seed_everything, nothing that makes a mask
    plan = absent.plan("05_masking")
    for name in ("causal_mask", "padding_mask", "to_additive_mask"):
        assert name in plan.stubs["attention_course.masking"]
    assert "sliding_window_mask" in plan.stubs["attention_course.kv"]  # (T, T): causal
    assert "alibi_causal_mask" in plan.stubs["attention_course.relative_positions"]
    assert "GPT" in plan.stubs["attention_course.gpt"]
    # exercise 10 hands out its building blocks, and what they use, not the layers
    plan = absent.plan("10_transformer")
    assert ("attention_course.multihead", "MultiHeadAttention") in plan.real
    assert ("attention_course.attention", "scaled_dot_product_attention") in plan.real
    assert {"EncoderLayer", "DecoderLayer", "Encoder"} <= set(
        plan.stubs["attention_course.transformer"]
    )


def test_the_targets_that_stay_real_in_their_own_build():
    """Where a task's target is in the closure of what the exercise hands out, the build
    cannot leave it out without breaking the given code: exercise 14 gives `apply_rope`
    (task 1) as `package_rope` for its task 4. For it the grader keeps its check that the
    candidate is not the reference itself, and the static scan. Exercise 13's model
    (`step_decoder`, a GPT made of `CausalSelfAttention`, task 2) is no longer one: the
    grader serves it (`absent.SERVED`), so neither the GPT nor its attention is real in
    13's build."""
    found = {e: absent.real_targets(e) for e in EXERCISES}
    found = {e: targets for e, targets in found.items() if targets}
    print(found)
    assert found == {
        "14_positions_that_generalise": [
            ("apply_rope", "attention_course.relative_positions.apply_rope")
        ],
    }
    plan = absent.plan("13_decoder_only")
    assert {"GPT", "GPTBlock", "CausalSelfAttention"} <= set(plan.stubs["attention_course.gpt"])
    assert "step_decoder" in plan.stubs["attention_course.checks.generation"]


STUBS = r"""
import importlib, sys
sys.path.insert(0, sys.argv[1])
import attention_course as ac
masking, checks = "attention_course.masking", "attention_course.checks"
quiz = "attention_course.quiz"

def refused(what):
    try:
        what()
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return "not refused"

out = {
    "call": refused(lambda: ac.causal_mask(4)),
    "module path": refused(lambda: importlib.import_module(masking).causal_mask(4)),
    "assembled": refused(lambda: ac.sliding_window_mask(4, 4)),
    "instantiate": refused(lambda: ac.LayerNorm(4)),
    "attribute": refused(lambda: ac.LayerNorm.forward),
    "new": refused(lambda: object.__new__(ac.LayerNorm).forward),
    "subclass": refused(lambda: type("Mine", (ac.LayerNorm,), {})),
    "checker": refused(lambda: importlib.import_module(checks).check_causal_mask(None)),
    "quiz": refused(lambda: importlib.import_module(quiz).check_quiz("05.x", None)),
}

def subclass():
    class Mine(ac.LayerNorm):
        def forward(self, x):
            return x

out["class statement"] = refused(subclass)
out["isinstance"] = isinstance(3, ac.LayerNorm)
out["name"] = (ac.causal_mask.__name__, ac.causal_mask.__module__, ac.LayerNorm.__name__)
out["given"] = str(ac.get_device())
print(repr(out))
"""


def test_a_stub_refuses_every_use(builds):
    folder = builds.get("05_masking").parent
    done = subprocess.run(
        [sys.executable, "-c", STUBS, str(folder)], capture_output=True, text=True, cwd="/"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = eval(done.stdout)  # noqa: S307 - our own repr of plain values
    gives = "(the exercise gives: attention_course.get_device, attention_course.seed_everything)"
    refused = "NotAvailableWhileGrading: attention_course."
    assert (
        out["call"]
        == out["module path"]
        == (f"{refused}causal_mask is not available while grading: write it yourself {gives}")
    )
    assert out["assembled"].startswith(f"{refused}sliding_window_mask is not available")
    for key in ("instantiate", "attribute", "subclass", "class statement"):
        assert out[key].startswith(f"{refused}LayerNorm is not available"), (key, out)
    # an instance made around the stub has no behaviour to call
    assert out["new"] == "AttributeError: 'LayerNorm' object has no attribute 'forward'"
    assert out["checker"].startswith(f"{refused}checks.masking.check_causal_mask is not")
    assert out["quiz"].startswith(f"{refused}quiz.check_quiz is not available")
    assert out["isinstance"] is False
    assert out["name"] == ("causal_mask", "attention_course.masking", "LayerNorm")
    assert out["given"] in ("cpu", "cuda", "mps")


def test_builds_are_cached_and_read_only(builds):
    first = builds.get("05_masking")
    assert builds.get("05_masking") == first
    assert builds.get("04_scaled_dot_product") != first
    mode = (first / "masking.py").stat().st_mode & 0o777
    assert mode == 0o644
    source = (first / "masking.py").read_text()
    assert "torch.ones" not in source and "_absent_.function(" in source
    assert (first / "device.py").read_text() == (ROOT / "attention_course/device.py").read_text()


def test_the_sandbox_shows_the_build_as_the_package(builds, tmp_path):
    from attention_course.grading import isolation

    if isolation.bwrap() is None:
        pytest.skip("bubblewrap is not installed")
    package = builds.get("05_masking")
    scratch = isolation.Scratch()
    try:
        args = isolation.command(["true"], scratch, package)
    finally:
        scratch.remove()
    at = args.index(f"{isolation.PACKAGE_MOUNT}/attention_course")
    assert args[at - 2 : at] == ["--ro-bind", str(package)]


# ---------------------------------------------------------------- graded in the sandbox

ATTACKS = sorted(p.name.removesuffix(".ipynb.json") for p in FIXTURES.glob("absent_*.ipynb.json"))


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    from attention_course import cli
    from attention_course.grading import isolation

    if isolation.bwrap() is None:  # pragma: no cover - CI installs bubblewrap
        pytest.skip("bubblewrap is not installed")
    pytest.importorskip("nbclient")
    klass = tmp_path_factory.mktemp("absent")
    for name in ATTACKS:
        text = (FIXTURES / f"{name}.ipynb.json").read_text().replace("@REPO@", str(ROOT))
        (klass / f"{name}.ipynb").write_text(text)
    shutil.copyfile(ROOT / "exercises" / "05_masking.ipynb", klass / "student_copy.ipynb")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.main(["grade", str(klass), "--jobs", "2", "--json", "--no-progress"])
    document = json.loads(out.getvalue())
    return {Path(s["notebook"]).stem: s for s in document["submissions"]}


def test_the_attacks_are_all_here():
    assert len(ATTACKS) == 11, ATTACKS


@pytest.mark.slow
@pytest.mark.parametrize("name", ATTACKS)
def test_calling_the_absent_reference_earns_nothing_and_is_named(graded, name):
    grade = graded[name]
    assert "score" in grade, f"{name} was not graded: {grade}"
    tasks = {t["name"]: t for t in grade["tasks"]}
    cheat = tasks["causal_mask"]
    assert cheat["score"] == 0 and not cheat["passed"], cheat
    assert ABSENT in cheat["reason"], cheat["reason"]
    # the student's own tasks keep their marks, unless the static scan counts a scratch
    # cell against every task (`sys.modules` read in the import hook's cell)
    for other, points in (("padding_mask", 2), ("combined_mask_shape", 1)):
        task = tasks[other]
        assert task["score"] == points or task["reason"].startswith(
            "not the student's own code: "
        ), task
    assert grade["score"] <= 3 and grade["sandboxed"] is True
    # the given demo cell (ac.causal_mask, ac.padding_mask) is a note, not a problem
    assert any(n.startswith("given cell ") for n in grade["notes"]), grade["notes"]
    assert not any("code-08" == c["id"] for c in grade["cell_problems"]), grade


@pytest.mark.slow
def test_the_student_copy_is_not_implemented_not_absent(graded):
    grade = graded["student_copy"]
    assert grade["score"] == 0, grade
    for task in grade["tasks"]:
        assert "not implemented" in task["reason"], task
        assert "not available while grading" not in task["reason"], task
