"""Verdicts and messages two fresh simulated students found wrong (sets 12 to 17), pinned.
Each test failed on the code before its fix.

1. 16 RMSNorm: eps=None taken from the weight's dtype passed every case.
2. 13 generate: an int32 tensor passed, though the task asks for a LongTensor.
3. 12 online_softmax_update: l' of shape (T,) made the chained case crash the checker.
4. 13 filter_logits: top-p on the raw logits was told it sorts in ascending order;
   13 CausalSelfAttention: dropout then renormalising (NaN) was told it dropped out the
   masked scores.
5. 15 rolling_update: slot (p + 1) % W was told that the buffer shifts; 12
   online_softmax_update: exponents from the block's own maximum, and a maximum not per
   row, got no hint; 12 kv_cache_bytes: 6881280.5 was shown as 6.88128e+06; 15 repeat_kv:
   an in-place change of a leaf input got PyTorch's raw error only; 15 sliding_window_mask:
   a window capped at size - 1 was told it is one too narrow.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from attention_course.checks import (
    check_causal_self_attention,
    check_filter_logits,
    check_generate,
    check_online_softmax_update,
    check_repeat_kv,
    check_rms_norm,
    check_rolling_update,
    check_sliding_window_mask,
)
from attention_course.quiz import check_quiz

sys.path.insert(0, os.path.dirname(__file__))
from buggy import generation as buggy_generation  # noqa: E402
from buggy import gpt as buggy_gpt  # noqa: E402
from buggy import kv as buggy_kv  # noqa: E402
from buggy import modern as buggy_modern  # noqa: E402
from buggy import rolling_cache as buggy_rolling  # noqa: E402
from buggy import sampling as buggy_sampling  # noqa: E402
from buggy import tiled as buggy_tiled  # noqa: E402


def _failures(report) -> str:
    return "\n".join(f"{r.name}: {r.message}" for r in report.results if not r.passed)


def _first_failure(report) -> str:
    return next(str(r.message) for r in report.results if not r.passed)


# ---------------------------------------------------------------- 1. 16 RMSNorm, eps=None


def test_rms_norm_eps_from_the_weights_dtype_is_rejected_and_named():
    report = check_rms_norm(buggy_modern.RMSNormEpsFromWeightDtype)
    assert not report.passed, f"eps from the weight's dtype was accepted:\n{report}"
    message = _first_failure(report)
    assert "eps=None takes the machine epsilon of the input's dtype" in message, message
    assert "as nn.RMSNorm does" in message, message


def test_the_reference_semantics_are_nn_rms_norms():
    """The new case's expectation is nn.RMSNorm's: a float32 module, a float64 input."""
    x = 1e-3 * (
        0.5 + torch.randn(2, 3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    )
    ours = __import__("attention_course").norms.RMSNorm(8)
    theirs = torch.nn.RMSNorm(8)
    torch.testing.assert_close(ours(x), theirs(x))


# ---------------------------------------------------------------- 2. 13 generate, dtype


def test_generate_returning_int32_is_rejected_and_names_long():
    report = check_generate(buggy_generation.generate_returns_int32)
    assert not report.passed, f"an int32 result was accepted:\n{report}"
    message = _first_failure(report)
    assert "torch.int32" in message and "torch.int64" in message, message
    assert ".long()" in message and "the tokens are right" in message, message


def test_generate_returning_int64_still_passes():
    assert check_generate(buggy_generation.reference_generate).passed


# ---------------------------------------------------------------- 3. 12 online update, shape


def test_online_update_l_without_keepdim_is_named_in_every_case():
    report = check_online_softmax_update(buggy_tiled.update_l_without_keepdim)
    assert not report.passed
    for result in report.results:
        message = str(result.message)
        assert not result.passed, f"{result.name} passed"
        assert "checker itself failed" not in message, f"{result.name}: {message}"
        if "the same failure as in the case" in message:
            continue  # the report names a repeated failure once
        assert "expected shape (" in message and "got (" in message, f"{result.name}: {message}"
        assert "keepdim=True" in message, f"{result.name}: {message}"
    last = report.results[-1]
    assert "ten scores" in last.name and "expected shape (2, 1), got (2,)" in str(last.message)


# ---------------------------------------------------------------- 4. 13 filter_logits, top-p


def test_top_p_on_the_logits_is_named_and_not_called_a_sort():
    report = check_filter_logits(buggy_sampling.filter_logits_top_p_on_logits)
    assert not report.passed
    assert "top-p on the logits, not the probabilities" in _first_failure(report)
    assert "ascending" not in _failures(report), _failures(report)


def test_an_ascending_sort_is_still_named():
    report = check_filter_logits(buggy_sampling.filter_logits_ascending)
    assert "sorts in ascending order" in _failures(report)


# ---------------------------------------------------------------- 4. 13 CausalSelfAttention


def test_dropout_then_renormalising_is_named_not_called_dropout_on_the_scores():
    report = check_causal_self_attention(buggy_gpt.CausalDropoutRenormalised)
    assert not report.passed
    message = _first_failure(report)
    assert "renormalised after dropout" in message, message
    assert "applied to the scores after the mask" not in message, message


def test_dropout_on_the_masked_scores_is_still_named():
    message = _first_failure(check_causal_self_attention(buggy_gpt.CausalDropoutOnMaskedScores))
    assert "dropout is applied to the scores after the mask" in message, message
    assert "renormalised" not in message, message


# ---------------------------------------------------------------- 5. 15 rolling_update


def test_a_slot_off_by_one_is_named_not_called_a_shift():
    report = check_rolling_update(buggy_rolling.rolling_update_slot_plus_one)
    assert not report.passed
    failures = _failures(report)
    assert "slot (p + 1) % W (off by one)" in _first_failure(report), failures
    assert "your buffer shifts" not in failures, failures


@pytest.mark.parametrize("impl", ["rolling_update_shift", "rolling_update_rolls"])
def test_a_shifting_buffer_is_still_named(impl):
    failures = _failures(check_rolling_update(getattr(buggy_rolling, impl)))
    assert "your buffer shifts" in failures, failures
    assert "off by one" not in failures, failures


# ---------------------------------------------------------------- 5. 12 online update, maxima


@pytest.mark.parametrize(
    "impl, phrase",
    [
        ("update_block_own_max", "the block's own maximum"),
        ("update_max_over_block", "the maximum is not taken per query row"),
        ("update_global_max", "the maximum is not taken per query row"),
    ],
)
def test_online_update_maximum_mistakes_are_named(impl, phrase):
    report = check_online_softmax_update(getattr(buggy_tiled, impl))
    assert not report.passed
    assert phrase in _first_failure(report), _failures(report)


# ---------------------------------------------------------------- 5. 12 kv_cache_bytes


def test_a_count_with_a_fraction_shows_the_fraction():
    message = _first_failure(check_quiz("12.kv_cache_bytes", lambda: 6881280.5))
    assert "got the number 6881280.5" in message, message


# ---------------------------------------------------------------- 5. 15 repeat_kv, in place


def test_an_in_place_change_of_a_leaf_input_is_explained():
    report = check_repeat_kv(buggy_kv.repeat_kv_scales_input_in_place)
    leaf = [str(r.message) for r in report.results if "leaf Variable" in str(r.message)]
    assert leaf, str(report)
    for message in leaf:
        assert "Hint: you changed an input in place" in message, message


# ---------------------------------------------------------------- 5. 15 window capped


def test_a_window_capped_at_size_minus_one_is_named():
    report = check_sliding_window_mask(buggy_kv.sliding_window_capped)
    assert not report.passed
    failures = _failures(report)
    assert "capped at size - 1" in _first_failure(report), failures
    assert "your window is one too narrow (off by one)" not in failures, failures


def test_a_window_one_too_narrow_is_still_named():
    failures = _failures(check_sliding_window_mask(buggy_kv.sliding_window_too_narrow))
    assert "one too narrow (off by one)" in failures, failures
