"""Exercise 12 (efficient attention): each classic mistake gets its named message, the
references pass, the "never builds T × S" rule holds in the check cell and in the grader
(where the candidate runs in another kernel), and the derived quiz answers are exact.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attention_course import tiled
from attention_course.checks import check_online_softmax_update, check_tiled_attention_loop
from attention_course.checks import tiled as messages
from attention_course.checks._sizes import record_sizes
from attention_course.quiz import check_quiz

sys.path.insert(0, os.path.dirname(__file__))
from buggy import tiled as buggy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TWIN = ROOT / "exercises" / "solutions" / "12_efficient_attention.ipynb"


def _first_failure(report) -> str:
    return next(r.message for r in report.results if not r.passed)


def test_references_pass():
    for check, reference in (
        (check_online_softmax_update, tiled.online_softmax_update),
        (check_tiled_attention_loop, tiled.tiled_attention_loop),
    ):
        report = check(reference)
        assert report.passed and report.score == 1.0, str(report)


@pytest.mark.parametrize(
    "impl, message",
    [
        (buggy.update_new_max_only, messages.NO_RESCALE),
        (buggy.update_sum_not_rescaled, messages.SUM_NOT_RESCALED),
        (buggy.update_acc_not_rescaled, messages.ACC_NOT_RESCALED),
        (buggy.update_divides_early, messages.DIVIDED_TOO_EARLY),
        (buggy.update_nan_on_masked_block, messages.MASKED_BLOCK_NAN),
        (buggy.update_block_max_only, messages.BLOCK_MAX_ONLY),
        (buggy.update_inverted_factor, messages.RESCALE_INVERTED),
        (buggy.update_raw_exp, messages.RAW_EXP),
        (buggy.update_old_max_exponent, messages.OLD_MAX_EXPONENT),
        (buggy.update_masked_as_lowest, messages.MASKED_AS_LOWEST),
        (buggy.update_masked_max_zero, messages.MASKED_MAX_ZERO),
    ],
    ids=lambda x: getattr(x, "__name__", "message"),
)
def test_each_update_mistake_is_named(impl, message):
    report = check_online_softmax_update(impl)
    assert not report.passed
    assert f"Likely mistake: {message}." in _first_failure(report), str(report)


@pytest.mark.parametrize(
    "impl, message",
    [
        (buggy.loop_new_max_only, messages.NO_RESCALE),
        (buggy.loop_sum_not_rescaled, messages.SUM_NOT_RESCALED),
        (buggy.loop_divides_inside, messages.DIVIDED_TOO_EARLY),
        (buggy.loop_starts_at_zero, messages.INIT_ZERO),
        (buggy.loop_drops_last_key_block, messages.LAST_KEY_BLOCK_DROPPED),
        (buggy.loop_ignores_causal, messages.CAUSAL_IGNORED),
        (buggy.loop_drops_last_query_block, messages.LAST_QUERY_BLOCK_DROPPED),
        (buggy.loop_scales_by_dv, messages.SCALE_DV),
        (buggy.loop_returns_acc_divided_inside, messages.DIVIDED_TOO_EARLY),
    ],
    ids=lambda x: getattr(x, "__name__", "message"),
)
def test_each_loop_mistake_is_named(impl, message):
    report = check_tiled_attention_loop(impl)
    assert not report.passed
    assert f"Likely mistake: {message}." in _first_failure(report), str(report)


def test_a_nan_on_a_masked_block_fails_only_that_case():
    report = check_online_softmax_update(buggy.update_nan_on_masked_block)
    failed = [r.name for r in report.results if not r.passed]
    assert failed == ["a fully masked block first (m stays -inf, l = 0, acc = 0; no NaN)"]


@pytest.mark.parametrize("impl", [buggy.loop_full_scores, buggy.loop_full_causal_mask])
def test_the_whole_score_matrix_is_caught_by_its_size(impl):
    """Right values, wrong memory: only the "never builds T × S" cases fail, by name."""
    report = check_tiled_attention_loop(impl)
    failed = {r.name: r.message for r in report.results if not r.passed}
    assert failed and all(name.startswith("never builds T × S") for name in failed), failed
    assert all("at least T·S = 61 × 67 = 4,087" in m for m in failed.values()), failed
    if impl is buggy.loop_full_scores:  # memory is the point of the task: values do not carry it
        assert report.score < 0.6


def test_exponents_from_the_old_maximum_fail_the_start_state_with_large_scores():
    """e^{s - m} e^{m - m'} gives the right numbers whenever s - m stays small: only the
    case that starts from m = -inf with scores near 1,000 sees it overflow."""
    report = check_online_softmax_update(buggy.update_old_max_exponent)
    failed = {r.name: r.message for r in report.results if not r.passed}
    assert list(failed) == [
        "scores near 1,000 from the start state (m = -inf): every exponent is at most 0"
    ], failed
    assert messages.OLD_MAX_EXPONENT in next(iter(failed.values()))


def test_no_float32_hint_when_the_error_is_infinite():
    """m' = 0 where the reference keeps -inf: an infinite error, never a rounding one."""
    report = check_online_softmax_update(buggy.update_masked_max_zero)
    failed = {r.name: r.message for r in report.results if not r.passed}
    assert "a fully masked block first (m stays -inf, l = 0, acc = 0; no NaN)" in failed
    assert not any("float32 precision" in m for m in failed.values()), failed


@pytest.mark.parametrize(
    "impl, phrase",
    [
        (buggy.loop_query_blocks_only, messages.WHOLE_ROW),
        (buggy.loop_key_blocks_only, messages.WHOLE_COLUMN),
    ],
    ids=["query blocks only", "key blocks only"],
)
def test_a_whole_row_or_column_of_scores_is_too_much(impl, phrase):
    """One loop instead of two: right values, tensors below T·S, but larger than any tile
    (B·bq·S = 938 and B·T·bk = 1,098 elements against the largest input's 536)."""
    report = check_tiled_attention_loop(impl)
    failed = {r.name: r.message for r in report.results if not r.passed}
    assert failed and all(name.startswith("never builds T × S") for name in failed), failed
    assert all(phrase in m and "more than the 536" in m for m in failed.values()), failed


def test_numpy_is_refused_inside_the_loop():
    report = check_tiled_attention_loop(buggy.loop_numpy_mask)
    failed = {r.name: r.message for r in report.results if not r.passed}
    assert len(failed) == len(report.results), failed  # refused in every case, by name
    assert all(
        messages.NO_NUMPY in m or m.startswith("the same failure as") for m in failed.values()
    ), failed


def test_a_square_causal_mask_is_caught_when_s_is_larger_and_when_t_is():
    """causal_mask(T) is T × T: below T·S when S > T, so the bound is the tile's; the
    T = 67 > S = 61 case is over T·S as well."""
    report = check_tiled_attention_loop(buggy.loop_square_causal_mask)
    failed = {r.name: r.message for r in report.results if not r.passed}
    assert list(failed) == [
        "never builds T × S, causal: T = 61, S = 67 and T = 67, S = 61, blocks of 7 and 9"
    ], failed
    assert "(61, 61), bool" in next(iter(failed.values()))
    assert messages.WHOLE_SQUARE in next(iter(failed.values()))
    q, k, v = torch.randn(2, 67, 4), torch.randn(2, 61, 4), torch.randn(2, 61, 3)
    with record_sizes() as largest:
        buggy.loop_square_causal_mask(q, k, v, 7, 9, causal=True)
    assert largest.elements == 67 * 67 > 67 * 61


@pytest.mark.parametrize("T, S", [(61, 67), (67, 61)])
def test_the_tile_limit_holds_for_the_reference_and_the_solved_twin_with_room(T, S):
    """The bound is honest: the reference (and the twin's loop, the same shape of code)
    stays within it, and a tile by broadcasting, B·bq·bk·Dk, fits too."""
    q, k, v = torch.randn(2, T, 4), torch.randn(2, S, 4), torch.randn(2, S, 3)
    out = torch.empty(2, T, 3)
    limit, tile = messages.tile_limit(q, k, v, out, 7, 9)
    assert (limit, tile) == (2 * max(T, S) * 4, 2 * 7 * 9 * 4)
    with record_sizes() as largest:
        tiled.tiled_attention_loop(q, k, v, 7, 9, causal=True)
    assert largest.elements <= limit
    with record_sizes() as largest:
        (q[:, :7, None, :] * k[:, None, :9, :]).sum(-1)
    assert largest.elements <= limit


def test_a_float64_state_with_a_float32_input_is_not_blamed_on_float64_inputs():
    report = check_tiled_attention_loop(buggy.loop_float64_state)
    failed = {r.name: r.message for r in report.results if not r.passed}
    assert list(failed) == ["float32 inputs: the result keeps float32"], failed
    message = failed["float32 inputs: the result keeps float32"]
    assert "uses float64 inputs" not in message, message


def test_the_size_recorder_counts_allocations_not_views():
    """A (T, 1) column expanded to (T, S) allocates nothing; a product does."""
    x, y = torch.randn(40, 1), torch.randn(1, 50)
    with record_sizes() as largest:
        x.expand(40, 50)
    assert largest.elements == 40
    with record_sizes() as largest:
        _ = x @ y
    assert largest.elements == 2000 and largest.shape == (40, 50) and largest.op == "aten.mm"


def test_recorders_are_per_thread_and_the_kernels_record_is_checked_as_data():
    """Two submissions graded at once (``--jobs``) run in two threads: a recorder in one
    never sees the other's tensors; a malformed record from a kernel is refused."""
    import threading

    from attention_course.checks import _sizes
    from attention_course.grading import sandbox

    seen = {}
    with record_sizes() as largest:
        thread = threading.Thread(target=lambda: seen.update(active=_sizes.active()))
        thread.start()
        thread.join()
        torch.zeros(3)
        sandbox._note_largest((50, (5, 10), "torch.float32", "aten.mm"))  # from the kernel
    assert seen == {"active": False}
    assert (largest.elements, largest.shape, largest.op) == (50, (5, 10), "aten.mm")
    with pytest.raises(sandbox.SandboxError):
        sandbox._note_largest((50, "(5, 10)", "torch.float32", "aten.mm"))


def test_the_reference_loop_never_holds_more_than_a_strip():
    q, k, v = torch.randn(2, 61, 4), torch.randn(2, 67, 4), torch.randn(2, 67, 3)
    with record_sizes() as largest:
        tiled.tiled_attention_loop(q, k, v, 7, 9, causal=True)
    assert largest.elements < 61 * 67 / 4  # the inputs and output, never a T x S slab


def test_the_update_handles_a_row_that_has_seen_nothing():
    m, l, acc = tiled.online_softmax_update(
        torch.full((2, 1), -math.inf),
        torch.zeros(2, 1),
        torch.zeros(2, 3),
        torch.tensor([[-math.inf, -math.inf], [0.5, -math.inf]]),
        torch.randn(2, 3),
    )
    assert bool(torch.isneginf(m[0]).all()) and float(l[0]) == 0 and bool((acc[0] == 0).all())
    assert float(m[1]) == 0.5 and float(l[1]) == 1.0


def test_the_kv_cache_answer_is_derived_and_accepts_numpy_and_tensors():
    bytes_ = 2 * 3 * 16 * 512 * 2 * (30 + 40)  # K and V, decoder layers, batch, d, bf16
    for answer in (bytes_, np.int64(bytes_), torch.tensor(bytes_), float(bytes_)):
        assert check_quiz("12.kv_cache_bytes", lambda a=answer: a).passed
    self_only = check_quiz("12.kv_cache_bytes", lambda: 2 * 3 * 16 * 512 * 2 * 30)
    assert "cross-attention" in _first_failure(self_only)
    encoder_too = check_quiz("12.kv_cache_bytes", lambda: bytes_ * 15 // 3)
    assert "only the decoder's layers" in _first_failure(encoder_too)
    # keys only and numbers instead of bytes give the same half: name both
    numbers = _first_failure(check_quiz("12.kv_cache_bytes", lambda: bytes_ // 2))
    assert "keys only" in numbers and "2 bytes" in numbers, numbers
    # the encoder's 12 layers and d_ff = 2048 for d_model both give 4 times the answer
    four = _first_failure(check_quiz("12.kv_cache_bytes", lambda: bytes_ * 4))
    assert "d_ff" in four and "encoder's 12 layers" in four, four
    # the other slips the student made get their cause, not "not the right count"
    for wrong, phrase in (
        (bytes_ // 8, "one head's share"),
        (bytes_ // 16, "one sentence's cache"),
        (bytes_ // 3, "one layer's cache"),
        (bytes_ // 1024, "KiB"),
        (2 * 16 * 512 * 2 * (3 * 30 + 12 * 40), "encoder's 12 layers cache nothing"),
        (2 * 16 * 512 * 2 * (15 * 30 + 3 * 40), "encoder's 12 layers cache nothing"),
        (2 * 3 * 16 * 512 * 2 * (31 + 40), "not 31"),
        (2 * 3 * 16 * 512 * 2 * 80, "different lengths"),
        (2 * 3 * 16 * 512 * 2 * 100, "not 30 + 70"),
    ):
        assert phrase in _first_failure(check_quiz("12.kv_cache_bytes", lambda w=wrong: w))


def test_merge_halves_answer_is_what_the_update_computes():
    """Option c, computed: merging two halves' states equals the whole row's attention."""
    g = torch.Generator().manual_seed(0)
    s = torch.randn(1, 10, generator=g, dtype=torch.float64) * 3
    v = torch.randn(10, 2, generator=g, dtype=torch.float64)
    start = (torch.full((1, 1), -math.inf, dtype=torch.float64), torch.zeros(1, 1, dtype=s.dtype))
    m1, l1, a1 = tiled.online_softmax_update(
        *start, torch.zeros(1, 2, dtype=s.dtype), s[:, :5], v[:5]
    )
    m2, l2, a2 = tiled.online_softmax_update(
        *start, torch.zeros(1, 2, dtype=s.dtype), s[:, 5:], v[5:]
    )
    m = torch.maximum(m1, m2)
    c1, c2 = torch.exp(m1 - m), torch.exp(m2 - m)
    merged = (c1 * a1 + c2 * a2) / (c1 * l1 + c2 * l2)
    torch.testing.assert_close(merged, torch.softmax(s, -1) @ v)
    assert check_quiz("12.merge_halves", lambda: "c").passed
    assert "rescale both" in _first_failure(check_quiz("12.merge_halves", lambda: "b"))


# ---------------------------------------------------------------- the grader

nbformat = pytest.importorskip("nbformat")


def _copy_with(tmp_path: Path, name: str, source: str) -> Path:
    nb = nbformat.read(TWIN, as_version=4)
    for cell in nb.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == name:
            cell.source = source
    path = tmp_path / TWIN.name
    nbformat.write(nb, path)
    return path


@pytest.mark.slow
def test_grader_gives_full_marks_and_catches_the_whole_matrix_in_the_kernel(tmp_path):
    """One kernel per notebook: the solved twin gets 7/7; a copy whose loop builds the whole
    T × S score matrix loses the points of that task only, with the named reason, although
    its function runs in the student's kernel and not in the grader."""
    pytest.importorskip("nbclient")
    from attention_course.grading import grade as grading

    solved = grading.grade_notebook(TWIN)
    assert [(t.name, t.score) for t in solved.tasks] == [
        ("online_softmax_update", 2.0),
        ("tiled_attention_loop", 3.0),
        ("kv_cache_bytes", 1.0),
        ("merge_halves", 1.0),
    ]
    whole = '''def tiled_attention_loop(query, key, value, block_q, block_k, causal=False):
    """softmax(Q K^T / sqrt(d_k)) V, one block_q x block_k tile of scores at a time."""
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])  # (..., T, S)
    if causal:
        T, S = scores.shape[-2:]
        keep = torch.ones(T, S, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~keep, -math.inf)
    return torch.softmax(scores, dim=-1) @ value
'''
    graded = {
        t.name: t
        for t in grading.grade_notebook(_copy_with(tmp_path, "tiled_attention_loop", whole)).tasks
    }
    assert [
        graded[n].score for n in ("online_softmax_update", "kv_cache_bytes", "merge_halves")
    ] == [2.0, 1.0, 1.0]
    loop = graded["tiled_attention_loop"]
    assert loop.score < 3.0
    assert loop.reason.startswith(
        "never builds T × S, nor a row or column of scores: T = 61, S = 67"
    ), loop.reason
    assert "at least T·S = 61 × 67 = 4,087" in loop.reason


@pytest.mark.slow
def test_grader_refuses_numpy_and_a_row_of_scores_in_the_kernel(tmp_path):
    """The numpy refusal and the tile limit hold in `attention-course grade` too, where the
    loop runs in the student's kernel: a causal mask built in numpy and a loop over query
    blocks only lose the task's points with the named reason."""
    pytest.importorskip("nbclient")
    import inspect

    from attention_course.grading import grade as grading

    numpy_mask = "import numpy as np\n\n" + inspect.getsource(buggy.loop_numpy_mask).replace(
        "loop_numpy_mask", "tiled_attention_loop"
    ).replace("    import numpy as np\n\n", "").replace("_good_update", "online_softmax_update")
    rows = inspect.getsource(buggy.loop_query_blocks_only).replace(
        "loop_query_blocks_only", "tiled_attention_loop"
    )
    for source, phrase in ((numpy_mask, messages.NO_NUMPY), (rows, messages.WHOLE_ROW)):
        graded = grading.grade_notebook(_copy_with(tmp_path, "tiled_attention_loop", source))
        loop = next(t for t in graded.tasks if t.name == "tiled_attention_loop")
        assert loop.score < 3.0, source
        assert phrase in loop.reason, loop.reason
