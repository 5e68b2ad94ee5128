"""What the kernel gets in place of the grader's objects (issue #25, gaps 1 and 4).

* A watched argument: exercise 15's check passes the buffer as a
  `attention_course.checks._watch.WriteWatch`, which notes an indexed write whose index
  repeats. Tensors cross to the kernel by value, so the grader marks the watched ones; the
  kernel wraps them in the same class and sends back what it noted. Before, a repeated-index
  write failed the check cell and got 3/3 from the grader.
* A served object: exercise 13's model (`step_decoder()`, a GPT made of the causal
  self-attention task 2 asks for) is never sent to the kernel. The kernel gets a stand-in
  whose call and the few methods and attributes the model offers
  (``served_while_grading``) run in the grader, on plain data; in 13's build
  `step_decoder` and the GPT are stubs, so no causal self-attention exists in the sandbox
  and a subclass of the model's attention class scores 0 with the reason named.

The fast tests run the kernel side (`sandbox.serve`) in a plain subprocess on the real
package; the slow one grades fixtures (`tests/fixtures/make_served.py`) in the sandbox.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch

from attention_course.checks import check_generate, check_rolling_update
from attention_course.checks.generation import OfferedModel, step_decoder
from attention_course.grading import sandbox
from attention_course.grading.sandbox import grade_task

sys.path.insert(0, os.path.dirname(__file__))
from buggy import generation as buggy_generation  # noqa: E402
from buggy.rolling_cache import rolling_update_repeated_index  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"

_SERVE = textwrap.dedent(
    """
    import sys
    namespace = {"__name__": "__main__"}
    exec(compile(open(sys.argv[1]).read(), "<student>", "exec"), namespace)
    from attention_course.grading.sandbox import serve
    serve(namespace, sys.argv[2], sys.argv[3])
    """
)


@contextlib.contextmanager
def kernel_side(source: str):
    """A client of `sandbox.serve` running ``source``'s names in another process (as in a
    kernel, without Jupyter or the sandbox)."""
    folder = tempfile.mkdtemp()
    try:
        student = os.path.join(folder, "student.py")
        Path(student).write_text(source)
        path, token = os.path.join(folder, "s"), secrets.token_hex(8)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        listener.settimeout(120)
        process = subprocess.Popen([sys.executable, "-c", _SERVE, student, path, token])
        try:
            sock, _ = listener.accept()
            listener.close()
            assert sandbox._recv(sock)[:2] == ("hello", token)
            client = sandbox.Client(sock, 30.0, lambda: None, lambda: process.poll() is None)
            try:
                yield client
            finally:
                client.close()
            process.wait(30)
        finally:
            if process.poll() is None:
                process.kill()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _grade(client, name: str, checker: str, seed: int) -> dict:
    task = {"name": name, "kind": "check", "checker": checker, "absent": True}
    result = grade_task(client, task, 10.0, seed=seed)
    assert result["status"] == "graded", result
    return result["report"]


def _verdicts(results) -> list[tuple]:
    """Per case: name, passed, and the last line of the message (the diagnosis)."""
    out = []
    for r in results:
        if not isinstance(r, dict):
            r = {"name": r.name, "passed": r.passed, "message": r.message}
        out.append((r["name"], r["passed"], (r["message"] or "").strip().splitlines()[-1:]))
    return out


# ---------------------------------------------------------------- a watched argument


def test_a_repeated_index_write_in_the_kernel_fails_as_in_the_check_cell():
    import inspect

    from buggy import rolling_cache

    source = "import torch\n\n" + inspect.getsource(rolling_cache)
    with kernel_side(source) as client:
        graded = _grade(client, "rolling_update_repeated_index", "check_rolling_update", 3)
    in_process = check_rolling_update(rolling_update_repeated_index, seed=3)
    assert not in_process.passed  # the check cell refuses it
    assert _verdicts(graded["results"]) == _verdicts(in_process.results)
    assert graded["score"] == pytest.approx(in_process.score) and not graded["passed"]
    failed = [r for r in graded["results"] if not r["passed"]]
    assert "an indexed write repeated the slot(s) [0, 1]" in failed[0]["message"]


def test_the_kernel_reports_writes_only_for_a_watched_tensor():
    """A record of writes for a call whose arguments the grader did not watch is refused."""
    with pytest.raises(sandbox.SandboxError, match="did not watch"):
        sandbox._note_repeated([[0, 1]], [torch.zeros(3)])
    with pytest.raises(sandbox.SandboxError, match="malformed"):
        sandbox._note_repeated([["0"]], [])


# ---------------------------------------------------------------- a served object

PROBE = """
import torch


def probe(model, prompt):
    seen = {"type": type(model).__name__, "repr": repr(model)}
    for name in ("gpt", "_modules", "state_dict", "calls"):
        try:
            getattr(model, name)
            seen[name] = "reached"
        except AttributeError as error:
            seen[name] = "AttributeError: " + str(error)
    try:
        model.vocab_size = 3
        seen["set"] = "set"
    except AttributeError as error:
        seen["set"] = "AttributeError: " + str(error)
    try:
        model(prompt, torch.arange(prompt.shape[1]), object())
    except TypeError as error:
        seen["kernel object"] = "TypeError: " + str(error)
    try:
        model(prompt.float(), torch.arange(prompt.shape[1]))
    except ValueError as error:
        seen["bad ids"] = "ValueError: " + str(error)
    try:
        model(torch.zeros(1, 2000, dtype=torch.long), torch.arange(2000))
    except ValueError as error:
        seen["large"] = "ValueError: " + str(error)
    # past the stand-in, straight to the grader: only what the model offers is run there
    server, key = object.__getattribute__(model, "_server"), object.__getattribute__(model, "_key")
    for op, name in (("call", "load_state_dict"), ("getattr", "gpt"), ("call", "__reduce__")):
        try:
            server.callback(op, key, name, ({},))
            seen["direct " + name] = "ran"
        except AttributeError as error:
            seen["direct " + name] = "AttributeError: " + str(error)
    cache = model.new_cache()
    logits = model(prompt, torch.arange(prompt.shape[1]), cache)
    seen["logits"] = logits
    seen["requires grad"] = logits.requires_grad
    seen["length"] = cache.length
    seen["positions"] = cache.positions
    seen["vocab"] = model.vocab_size
    seen["device"] = str(next(model.parameters()).device)
    seen["range"] = tuple(model(prompt, range(3)).shape)
    with torch.no_grad():
        seen["no grad"] = model(prompt[:, -1:], torch.tensor([cache.length]), cache).requires_grad
    return seen
"""


def test_the_model_stays_in_the_grader_and_offers_only_its_interface():
    model = step_decoder()
    prompt = torch.tensor([[1, 2, 3]])
    with kernel_side(PROBE) as client:
        probe, _ = client.lookup("probe")
        seen = probe(OfferedModel(model), prompt)  # what the check gives generate
    assert seen["type"] == "_Served" and seen["repr"] == "<OfferedModel, run by the grader>"
    for name in ("gpt", "_modules", "state_dict", "calls"):
        assert seen[name].startswith("AttributeError: "), (name, seen[name])
    assert "it offers new_cache, eval, train, parameters, vocab_size, training" in seen["gpt"]
    assert seen["set"] == "AttributeError: the grader's OfferedModel is read-only here"
    assert seen["kernel object"].startswith("TypeError: the grader's model takes tensors")
    assert seen["bad ids"].startswith("ValueError: ids: got a torch.float32 tensor")
    assert seen["large"].startswith("ValueError: a tensor of 2000 elements is more than")
    assert seen["direct load_state_dict"] == (
        "AttributeError: the grader's OfferedModel has no method 'load_state_dict'"
    )
    assert seen["direct gpt"] == (
        "AttributeError: the grader's OfferedModel has no attribute 'gpt'"
    )
    assert seen["direct __reduce__"].endswith("has no method '__reduce__'")
    # the calls ran on the grader's model: its log has them, its cache is the grader's
    assert model.logged_calls() == [(1, 0, 3, 0, 2), (2, 0, 3, 0, 2), (1, 3, 1, 3, 3)]
    assert torch.equal(seen["logits"], step_decoder()(prompt, torch.arange(3)).detach())
    assert seen["requires grad"] is True and seen["no grad"] is False
    assert seen["length"] == 3 and torch.equal(seen["positions"], torch.arange(3))
    assert seen["vocab"] == model.vocab_size
    assert seen["device"] == "cpu"
    assert seen["range"] == (1, 3, model.vocab_size)


def _twin_generate_source() -> str:
    """The solved twin's `generate` cell of exercise 13."""
    nb = json.loads((ROOT / "exercises/solutions/13_decoder_only.ipynb").read_text())
    (twin,) = [
        "".join(c["source"])
        for c in nb["cells"]
        if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "generate"
    ]
    return twin


def _twin_generate():
    """The solved twin's `generate`, as a function of this process."""
    namespace: dict = {}
    exec(compile("import torch\n\n" + _twin_generate_source(), "<twin>", "exec"), namespace)
    return namespace["generate"]


def test_generate_through_the_served_model_agrees_with_the_check_cell():
    """The solved twin's `generate` and every catalogue mistake: the same per-case verdicts
    and diagnoses through the served model as in-process."""
    import inspect

    twin = _twin_generate_source()
    source = "import torch\n\n" + twin + "\n\n" + inspect.getsource(buggy_generation)
    names = ["generate"] + [f.__name__ for _, _, f, _ in buggy_generation.CATALOGUE]
    with kernel_side(source) as client:
        graded = {name: _grade(client, name, "check_generate", 5) for name in names}
    assert graded["generate"]["passed"] and graded["generate"]["score"] == 1.0
    for _, _, function, _ in buggy_generation.CATALOGUE:
        in_process = check_generate(function, seed=5)
        assert not in_process.passed
        got = graded[function.__name__]
        assert _verdicts(got["results"]) == _verdicts(in_process.results), function.__name__


@pytest.mark.parametrize("reach", ["model.to(prompt.device)", "model.gpt", "model.state_dict()"])
def test_the_check_cell_offers_generate_only_what_the_grader_offers(reach):
    # a generate that reaches past the offered interface: the grader's stand-in refused it
    # while the check cell, given the real model, passed it; now both give the same offer
    right = _twin_generate()
    assert check_generate(right).passed

    def generate(model, prompt, max_new_tokens, temperature=1.0, generator=None):
        eval(reach, {"model": model, "prompt": prompt})
        return right(model, prompt, max_new_tokens, temperature, generator)

    report = check_generate(generate)
    assert not report.passed and "is not offered: the model given to generate offers" in str(
        report
    ), str(report)


def test_generate_may_switch_the_mode_and_restore_it():
    # an honest style the fourth simulated student found refused: train() is offered too
    right = _twin_generate()

    def generate(model, prompt, max_new_tokens, temperature=1.0, generator=None):
        was = model.training
        model.eval()
        try:
            return right(model, prompt, max_new_tokens, temperature, generator)
        finally:
            model.train(was)

    report = check_generate(generate)
    assert report.passed, str(report)


# ---------------------------------------------------------------- graded in the sandbox

SUBMISSIONS = sorted(p.name.removesuffix(".ipynb.json") for p in FIXTURES.glob("served_*"))


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    from attention_course import cli
    from attention_course.grading import isolation

    if isolation.bwrap() is None:  # pragma: no cover - CI installs bubblewrap
        pytest.skip("bubblewrap is not installed")
    pytest.importorskip("nbclient")
    klass = tmp_path_factory.mktemp("served")
    for name in SUBMISSIONS:
        shutil.copyfile(FIXTURES / f"{name}.ipynb.json", klass / f"{name}.ipynb")
    for exercise in ("13_decoder_only", "15_sharing_keys_values"):
        shutil.copyfile(
            ROOT / "exercises/solutions" / f"{exercise}.ipynb", klass / f"{exercise}.ipynb"
        )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.main(["grade", str(klass), "--jobs", "2", "--json", "--no-progress", "--seed", "7"])
    document = json.loads(out.getvalue())
    # CI twice saw one submission of this run come back ungraded (an entry without tasks:
    # the grading raised; cause not found, not reproduced in 9 runs here, loaded or not). An
    # instructor regrades such a file (`--resume`); so does this fixture, once, alone, and
    # a submission that fails again fails the test with its error.
    for index, entry in enumerate(document["submissions"]):
        if "tasks" not in entry:
            again = io.StringIO()
            with contextlib.redirect_stdout(again):
                cli.main(["grade", entry["notebook"], "--json", "--no-progress", "--seed", "7"])
            regraded = json.loads(again.getvalue())  # one file: its grade itself
            assert "tasks" in regraded, (entry, regraded)
            document["submissions"][index] = regraded
    return {
        Path(s["notebook"]).stem: {t["name"]: t for t in s["tasks"]} | {"": s}
        for s in document["submissions"]
    }


def test_the_submissions_are_all_here():
    assert SUBMISSIONS == ["served_csa_gpt", "served_csa_subclass", "served_repeated_index"]


@pytest.mark.slow
def test_the_sandbox_grades_as_the_check_cell_and_leaves_no_attention_to_subclass(graded):
    # the solved twins: full marks, in the sandbox
    for exercise in ("13_decoder_only", "15_sharing_keys_values"):
        grade = graded[exercise][""]
        assert grade["sandboxed"] and grade["score"] == grade["max_score"], grade
    # exercise 15: the repeated-index write scores what the check cell gives (was 3/3)
    tasks = graded["served_repeated_index"]
    with_seed = check_rolling_update(rolling_update_repeated_index, seed=7)
    assert tasks["rolling_update"]["score"] == round(3 * with_seed.score, 2) < 3
    assert "an indexed write repeated the slot(s)" in tasks["rolling_update"]["reason"]
    assert tasks[""]["score"] == 5 + round(3 * with_seed.score, 2)
    # exercise 13: the attention class of the given model, or of a GPT, is not there (was 3/3)
    for name, reference in (
        ("served_csa_subclass", "attention_course.checks.generation.step_decoder"),
        ("served_csa_gpt", "attention_course.GPT"),
    ):
        tasks = graded[name]
        task = tasks["CausalSelfAttention"]
        assert task["score"] == 0 and not task["passed"], task
        assert f"{reference} is not available while grading" in task["reason"], task["reason"]
        assert tasks[""]["score"] == 8, tasks[""]  # generate, through the served model: 3/3
        assert tasks["generate"]["score"] == 3
