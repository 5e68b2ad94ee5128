"""The grader's checks are out of the student's reach (issue #17, section 1).

``attention-course grade`` runs each checker in its own process on proxies of the
student's objects (:mod:`attention_course.grading.sandbox`). Two things are tested here:

* the proxies change nothing for an honest notebook: each task's report equals the one
  the same checker gives in-process on the notebook's own objects (solved twins: full
  marks; student copies: the same "not implemented" reports), for exercises 04, 06
  (modules and gradients), 07 (norms, training mode, running statistics) and 13
  (CausalSelfAttention, filter_logits, quizzes);
* the adversarial submissions of ``tests/fixtures/cheat_*.ipynb`` (written by
  ``tests/fixtures/make_cheats.py``) earn nothing they should not, and the reason is
  named.

Each notebook is graded once (a kernel each, 5-20 s on two cores).
"""

from __future__ import annotations

import linecache
import os
import traceback
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

import torch  # noqa: E402

from attention_course.grading import grade as grading  # noqa: E402
from attention_course.grading import sandbox  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def _grade(path: Path, **options) -> grading.Grade:
    return grading.grade_notebook(path, **options)


def _by_name(grade: grading.Grade) -> dict[str, grading.TaskGrade]:
    return {t.name: t for t in grade.tasks}


# ---------------------------------------------------------------- honest notebooks


def _in_process_reports(path: Path, seed: int = 0) -> dict[str, dict]:
    """Run the notebook's cells (not its check cells) in this process, then each task's
    checker on the notebook's own objects, its inputs drawn from the run seed ``seed``:
    with 0, the reports the check cells show students."""
    from attention_course import checks
    from attention_course.quiz import check_quiz

    nb = nbformat.read(path, as_version=4)
    namespace: dict = {"__name__": "__main__"}
    state = torch.get_rng_state(), torch.get_default_dtype()
    try:
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or grading._is_check_cell(cell):
                continue
            name = f"<cell {path.stem} {index}>"
            lines = cell.source.splitlines(True)
            linecache.cache[name] = (len(cell.source), None, lines, name)  # "at line ..."
            try:
                exec(compile(cell.source, name, "exec"), namespace)
            except Exception:  # noqa: BLE001 - the stubs raise NotImplementedError
                traceback.clear_frames(None)
        reports = {}
        for task in grading.find_tasks(nb):
            candidate = namespace[task["name"]]
            if task["kind"] == "quiz":
                report = check_quiz(
                    task["question"], candidate, timeout=grading.CHECK_TIMEOUT, seed=seed
                )
            else:
                checker = getattr(checks, task["checker"])
                report = checker(candidate, timeout=grading.CHECK_TIMEOUT, seed=seed)
            reports[task["name"]] = report.to_dict()
        return reports
    finally:
        torch.set_rng_state(state[0])
        torch.set_default_dtype(state[1])


HONEST = [
    "solutions/04_scaled_dot_product",
    "04_scaled_dot_product",
    "solutions/06_multi_head_attention",
    "06_multi_head_attention",
    "solutions/07_layernorm_batchnorm",
    "07_layernorm_batchnorm",
    "solutions/13_decoder_only",
    "13_decoder_only",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", HONEST)
def test_proxies_grade_like_the_checker_in_process(name, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    path = ROOT / "exercises" / f"{name}.ipynb"
    grade = _grade(path)
    expected = _in_process_reports(path, grade.seed)  # the grader's run seed: its inputs
    assert [t.name for t in grade.tasks] == list(expected)
    for task in grade.tasks:
        assert task.report == expected[task.name], task.name
        assert task.fraction == pytest.approx(expected[task.name]["score"])
    if name.startswith("solutions/"):
        assert grade.passed and grade.score == grade.max_score, grade.table()
    else:
        assert grade.score == 0
        assert all("not implemented" in t.reason for t in grade.tasks), grade.table()


# ---------------------------------------------------------------- adversaries


def _fixture(name: str) -> Path:
    path = FIXTURES / f"{name}.ipynb"
    assert path.exists(), f"run python tests/fixtures/make_cheats.py ({path.name} is missing)"
    return path


@pytest.fixture(scope="module")
def patched_checkers():
    return _grade(_fixture("cheat_patch_checkers"))


@pytest.fixture(scope="module")
def patched_torch():
    return _grade(_fixture("cheat_patch_torch"))


@pytest.fixture(scope="module")
def forged_output():
    return _grade(_fixture("cheat_forged_output"))


@pytest.fixture(scope="module")
def reach_grader():
    return _grade(_fixture("cheat_reach_grader"))


@pytest.fixture(scope="module")
def evil_objects(tmp_path_factory):
    log = tmp_path_factory.mktemp("cheat") / "log.txt"
    old = os.environ.get("ATTENTION_COURSE_CHEAT_LOG")
    os.environ["ATTENTION_COURSE_CHEAT_LOG"] = str(log)
    try:
        grade = _grade(_fixture("cheat_evil_objects"))
    finally:
        if old is None:
            del os.environ["ATTENTION_COURSE_CHEAT_LOG"]
        else:
            os.environ["ATTENTION_COURSE_CHEAT_LOG"] = old
    lines = log.read_text().split("\n") if log.exists() else []
    return grade, [line.split() for line in lines if line]


@pytest.mark.slow
def test_rebinding_the_checkers_and_the_report_earns_nothing(patched_checkers):
    grade = patched_checkers
    cell = next(c for c in grade.cells if c.id == "cheat-patch-checkers")
    assert cell.status == "ok"  # the patching cell ran, in the kernel
    assert grade.score == 0 and not grade.passed
    for task in grade.tasks:  # named since the grader's own modules are flagged anywhere
        assert task.reason.startswith(
            (
                "implemented: not implemented yet",
                "not the student's own code: the notebook reaches into the grader's own code",
            )
        ), task.reason


@pytest.mark.slow
def test_patching_torch_comparisons_earns_nothing(patched_torch):
    tasks = _by_name(patched_torch)
    sdpa = tasks["scaled_dot_product_attention"]
    assert not sdpa.passed and sdpa.score < 1, sdpa.reason
    assert "wrong values" in sdpa.reason and "Likely mistake" in sdpa.reason, sdpa.reason
    assert tasks["which_bug"].score == 0
    assert '"a" is not right' in tasks["which_bug"].reason
    assert tasks["predicted_variances"].score == 0
    assert "(1, 1)" in tasks["predicted_variances"].reason


@pytest.mark.slow
def test_forged_grader_lines_and_replies_earn_nothing(forged_output):
    grade = forged_output
    assert grade.score == 0, grade.table()
    tasks = _by_name(grade)
    assert "which_bug" in tasks and tasks["which_bug"].reason, grade.table()
    for task in grade.tasks:
        assert not task.passed and task.reason, task


@pytest.mark.slow
def test_a_candidate_cannot_reach_the_checker_or_the_reference_output(reach_grader):
    tasks = _by_name(reach_grader)
    sdpa = tasks["scaled_dot_product_attention"]
    assert sdpa.score == 0 and not sdpa.passed, sdpa.reason
    # The cheat scan names the import of the checks' internals first; under it, the
    # checker's own report (run in the grader, out of the candidate's reach) failed too.
    assert "calls the reference `attention_course.checks" in sdpa.reason, sdpa.reason
    failing = [r for r in sdpa.report["results"] if not r["passed"]]
    assert failing and "wrong values" in failing[0]["message"], sdpa.report
    # the honest answers next to it still count
    assert tasks["which_bug"].passed and tasks["predicted_variances"].passed


@pytest.mark.slow
def test_objects_that_would_run_code_in_the_grader_are_failed_cases(evil_objects):
    grade, log = evil_objects
    tasks = _by_name(grade)
    sdpa = tasks["scaled_dot_product_attention"]
    assert sdpa.score == 0, sdpa.reason
    assert "expected a torch.Tensor, got EvilTensor" in sdpa.reason, sdpa.reason
    assert tasks["which_bug"].score == 0
    assert "got a Anything" in tasks["which_bug"].reason, tasks["which_bug"].reason
    assert tasks["predicted_variances"].score == 0
    assert "is not right" in tasks["predicted_variances"].reason
    # the student's hooks ran, if at all, in the kernel: never in this process
    assert all(pid != str(os.getpid()) for _, pid in log), log


@pytest.mark.slow
def test_breaking_the_graders_probe_is_named_and_scores_nothing():
    grade = _grade(_fixture("cheat_break_probe"))  # the solved notebook, probe broken
    assert grade.score == 0
    for task in grade.tasks:
        assert task.reason.startswith("not graded: the grader's probe ended"), task.reason


# ---------------------------------------------------------------- time limits


@pytest.mark.slow
def test_a_call_over_its_limit_is_interrupted_and_a_deaf_kernel_named(tmp_path):
    """Task 1 loops (interrupted, graded as a time-out); task 2 ignores the interrupt
    (the kernel does not come back: named); task 3 is graded on a fresh kernel."""
    nb = nbformat.read(ROOT / "exercises" / "solutions" / "04_scaled_dot_product.ipynb", 4)
    sources = {
        "task1-solution": (
            "def scaled_dot_product_attention(query, key, value, mask=None, dropout_p=0.0,"
            " scale=None):\n    while True:\n        pass\n"
        ),
        "task2-solution": (
            "import signal\nimport time\n\n\ndef which_bug():\n"
            "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "    while True:\n        time.sleep(0.05)\n"
        ),
    }
    for cell in nb.cells:
        if cell.get("id") in sources:
            cell.source = sources[cell.id]
    path = tmp_path / "04_loops.ipynb"
    nbformat.write(nb, path)
    grade = _grade(path, check_timeout=2.0)
    loop, deaf, after = grade.tasks
    # the limit is CPU seconds of the kernel, not wall time
    assert loop.score == 0, loop.reason
    assert "raised TimeLimitExceeded: ran over the time limit of 2 CPU seconds" in loop.reason
    assert "\nat line" not in loop.reason  # no line of the grader's shown as the student's
    assert deaf.score == 0
    assert "did not come back after an interrupt" in deaf.reason, deaf.reason
    assert after.passed, after.reason  # a lost kernel costs only the task it was lost in


# ---------------------------------------------------------------- no kernel needed


def test_messages_are_read_as_data_only():
    """A pickle (which could call a function when loaded) is refused by the reader the
    grader uses; a message of tensors, tuples, lists and dicts comes through as it was."""
    import pickle
    import socket
    import struct

    class Call:
        def __reduce__(self):
            return (os.getpid, ())

    a, b = socket.socketpair()
    try:
        data = pickle.dumps(Call())
        a.sendall(struct.pack("!QQ", 1, len(data)) + data)
        with pytest.raises(ValueError):  # not JSON
            sandbox._recv(b)
        message = (
            "ok",
            [torch.arange(6.0).reshape(2, 3), torch.ones(2, dtype=torch.bool), (), None],
            {"rng": torch.get_rng_state(), "meta": torch.empty(2, 5, device="meta")},
        )
        sandbox._send(a, message)
        got = sandbox._recv(b)
        assert got[0] == "ok" and type(got[1]) is list and got[1][2:] == [(), None]
        assert torch.equal(got[1][0], message[1][0]) and got[1][1].dtype == torch.bool
        assert torch.equal(got[2]["rng"], message[2]["rng"])
        assert got[2]["meta"].device.type == "meta" and got[2]["meta"].shape == (2, 5)
    finally:
        a.close()
        b.close()


def test_malformed_values_are_refused():
    client = sandbox.Client.__new__(sandbox.Client)
    client.proxies, client.classes = {}, {}
    for bad in [("v", object), ("t", "x", 0, 0, 0, 0), ("dict", [(("t", 1), ("v", 1))]), "v", ()]:
        with pytest.raises(sandbox.SandboxError):
            client.decode(bad)
    assert client.decode(("tuple", [("v", 1), ("size", [2, 3])])) == (1, torch.Size([2, 3]))
    assert client.decode(("dtype", "torch.float64")) is torch.float64
    with pytest.raises(sandbox.SandboxError):
        client.decode(("dtype", "manual_seed"))  # a name of torch that is not a dtype


def _thread_session(namespace: dict) -> sandbox.Session:
    """A session whose "kernel" is a thread of this process running the probe on
    ``namespace``: the protocol without a kernel (for fast tests)."""
    import threading

    def execute(source: str) -> str:
        threading.Thread(target=exec, args=(source, namespace), daemon=True).start()
        return "thread"

    return sandbox.Session(execute, lambda: None, lambda: True, limit=30.0)


def test_the_graders_objects_go_to_the_candidate_and_changes_come_back():
    source = (
        "import torch\n"
        "def find(model, ids):\n"
        "    with torch.no_grad():\n"
        "        model.weight.zero_()\n"
        "    return tuple(model(ids).shape), type(model).__name__\n"
    )
    namespace: dict = {}
    exec(source, namespace)
    model = torch.nn.Linear(3, 2)
    with _thread_session(namespace) as client:
        find, module = client.lookup("find")
        assert isinstance(find, sandbox.RemoteFunction) and module == ""
        assert find(model, torch.ones(4, 3)) == ((4, 2), "Linear")
    assert bool((model.weight == 0).all())  # the candidate's in-place change is seen


def test_a_torch_submodule_is_an_instance_of_its_class_through_the_proxy():
    """``isinstance(student.w1, nn.Linear)`` holds through the stand-in (the SwiGLU checker
    asks it), and a student's own module class is not taken for a torch one."""
    from attention_course.checks import check_swiglu

    source = (
        "import torch\n"
        "from torch import nn\n"
        "class Gate(nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x\n"
        "class SwiGLU(nn.Module):\n"
        "    def __init__(self, d_model, d_ff, bias=False):\n"
        "        super().__init__()\n"
        "        self.w1 = nn.Linear(d_model, d_ff, bias=bias)\n"
        "        self.w3 = nn.Linear(d_model, d_ff, bias=bias)\n"
        "        self.w2 = nn.Linear(d_ff, d_model, bias=bias)\n"
        "        self.gate = Gate()\n"
        "    def forward(self, x):\n"
        "        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))\n"
    )
    namespace: dict = {}
    exec(source, namespace)
    with _thread_session(namespace) as client:
        cls, _ = client.lookup("SwiGLU")
        module = cls(4, 6)
        assert isinstance(module.w1, torch.nn.Linear)
        assert not isinstance(module.gate, torch.nn.Linear)
        assert isinstance(module.gate, torch.nn.Module)
        report = check_swiglu(cls)
    assert report.passed, str(report)


def test_a_module_class_checked_through_the_proxies_in_a_thread():
    """The LayerNorm checker (modules, parameters, gradients, a forbidden built-in) gives
    the same report on the proxy of a class as on the class itself."""
    from attention_course.checks import check_layer_norm

    source = (
        "import torch\n"
        "from torch import nn\n"
        "class LayerNorm(nn.Module):\n"
        "    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True):\n"
        "        super().__init__()\n"
        "        self.shape = (normalized_shape,) if isinstance(normalized_shape, int) "
        "else tuple(normalized_shape)\n"
        "        self.eps = eps\n"
        "        if elementwise_affine:\n"
        "            self.weight = nn.Parameter(torch.ones(self.shape))\n"
        "            self.bias = nn.Parameter(torch.zeros(self.shape))\n"
        "        else:\n"
        "            self.weight = self.bias = None\n"
        "    def forward(self, x):\n"
        "        return nn.functional.layer_norm(x, self.shape, self.weight, self.bias, self.eps)\n"
    )
    namespace: dict = {}
    exec(source, namespace)
    expected = check_layer_norm(namespace["LayerNorm"]).to_dict()
    with _thread_session(namespace) as client:
        proxy, _ = client.lookup("LayerNorm")
        assert isinstance(proxy, type) and issubclass(proxy, torch.nn.Module)
        got = check_layer_norm(proxy).to_dict()
    assert got == expected
    assert "do not call the built-in `F.layer_norm`" in str(got)


def test_a_forbidden_attention_built_in_is_named_through_the_proxies():
    """Exercise 13's checker forbids F.scaled_dot_product_attention (the package's own
    modules may call it): a class that uses it fails with the same report on its proxy,
    and the report names the built-in."""
    from attention_course.checks import check_causal_self_attention

    source = (
        "import torch\n"
        "from torch import nn\n"
        "import torch.nn.functional as F\n"
        "class CausalSelfAttention(nn.Module):\n"
        "    def __init__(self, d_model, num_heads, bias=False, dropout=0.0):\n"
        "        super().__init__()\n"
        "        self.num_heads, self.dropout = num_heads, dropout\n"
        "        self.w_q = nn.Linear(d_model, d_model, bias=bias)\n"
        "        self.w_k = nn.Linear(d_model, d_model, bias=bias)\n"
        "        self.w_v = nn.Linear(d_model, d_model, bias=bias)\n"
        "        self.w_o = nn.Linear(d_model, d_model, bias=bias)\n"
        "    def forward(self, x):\n"
        "        B, T, D = x.shape\n"
        "        split = lambda t: t.view(B, T, self.num_heads, -1).transpose(1, 2)\n"
        "        q, k, v = split(self.w_q(x)), split(self.w_k(x)), split(self.w_v(x))\n"
        "        p = self.dropout if self.training else 0.0\n"
        "        h = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)\n"
        "        return self.w_o(h.transpose(1, 2).reshape(B, T, D))\n"
    )
    namespace: dict = {}
    exec(source, namespace)
    expected = check_causal_self_attention(namespace["CausalSelfAttention"]).to_dict()
    with _thread_session(namespace) as client:
        proxy, _ = client.lookup("CausalSelfAttention")
        got = check_causal_self_attention(proxy).to_dict()
    assert got == expected
    assert not got["passed"]
    assert "do not call `F.scaled_dot_product_attention`" in str(got)


WRONG_KINDS = {
    "an instance instead of the class": (
        "check_multi_head_attention",
        "from attention_course import MultiHeadAttention as M\nMultiHeadAttention = M(8, 2)\n",
    ),
    "a class that is not a module": (
        "check_multi_head_attention",
        "class MultiHeadAttention:\n    pass\n",
    ),
    "a number instead of a function": ("check_soft_argmax", "soft_argmax = 3\n"),
    "a class instead of a function": (
        "check_soft_argmax",
        "import torch\nclass soft_argmax(torch.nn.Module):\n    pass\n",
    ),
    "a function that raises ValueError": (
        "check_soft_argmax",
        "def soft_argmax(x, dim=-1):\n    raise ValueError('no')\n",
    ),
}


@pytest.mark.parametrize("kind", list(WRONG_KINDS))
def test_wrong_kinds_of_candidate_get_the_same_message(kind):
    from attention_course import checks

    checker_name, source = WRONG_KINDS[kind]
    checker = getattr(checks, checker_name)
    namespace: dict = {}
    exec(source, namespace)
    target = checker_name.removeprefix("check_")
    name = "MultiHeadAttention" if "multi_head" in target else target
    expected = checker(namespace[name], timeout=5).to_dict()
    with _thread_session(namespace) as client:
        proxy, _ = client.lookup(name)
        got = checker(proxy, timeout=5).to_dict()
    assert got == expected
