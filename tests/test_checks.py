"""The exercise checkers accept the reference, reject every catalogued mistake
(naming it where they claim to), and never raise because of student code."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import pytest
import torch
from torch import nn

import attention_course as ac
from attention_course.checks import (
    CHECKERS,
    CaseResult,
    Report,
    check_layer_norm,
    check_soft_argmax,
)
from attention_course.checks._runner import NOT_IMPLEMENTED_MESSAGE

sys.path.insert(0, os.path.dirname(__file__))
from buggy import CATALOGUE, REFERENCES, names  # noqa: E402

# PyTorch loads its meta-device kernels on their first use (about 3 s, once per process);
# load them here so that the timings below measure the checkers, not that import.
torch.ones(2, 2, dtype=torch.bool, device="meta").tril()

FUNCTION_TARGETS = [t for t, r in REFERENCES.items() if not isinstance(r, type)]
CLASS_TARGETS = [t for t, r in REFERENCES.items() if isinstance(r, type)]


def test_every_target_has_a_checker_and_three_mistakes():
    assert set(CHECKERS) == set(REFERENCES)
    for target in REFERENCES:
        assert sum(entry[0] == target for entry in CATALOGUE) >= 3, target
    for _, name, impl, _ in CATALOGUE:
        assert impl.__doc__, f"{name}: the docstring must name the mistake"


@pytest.mark.parametrize("target", list(REFERENCES))
def test_reference_passes(target):
    # No wall-clock assert here: timings flake on busy cores. The checkers' speed shows
    # in the exercise notebooks' run time, which nbval's cell time-out bounds.
    report = CHECKERS[target](REFERENCES[target])
    assert report.passed, str(report)
    assert report.score == 1.0
    assert len(report.results) >= 5


@pytest.mark.parametrize(
    "target, name, impl, phrase", CATALOGUE, ids=[f"{t}-{n}" for t, n, _, _ in CATALOGUE]
)
def test_buggy_implementation_is_rejected(target, name, impl, phrase):
    report = CHECKERS[target](impl)
    assert not report.passed, f"{name} was accepted:\n{report}"
    assert report.score < 1.0
    assert names(report, phrase), f"expected {phrase!r} named in:\n{report}"


def test_reports_are_deterministic():
    from buggy.attention import sdpa_no_scaling

    check = CHECKERS["scaled_dot_product_attention"]
    assert str(check(sdpa_no_scaling)) == str(check(sdpa_no_scaling))


# ---------------------------------------------------------------- never raise


def _raises(scores, beta=1.0, dim=-1):
    return scores[100]  # IndexError in student code


def _returns_string(scores, beta=1.0, dim=-1):
    return "weights"


def _returns_nan(scores, beta=1.0, dim=-1):
    return torch.full_like(scores, float("nan"))


def _mutates(scores, beta=1.0, dim=-1):
    scores.mul_(beta)
    return torch.softmax(scores, dim=dim)


def _sleeps(scores, beta=1.0, dim=-1):
    time.sleep(0.6)
    return torch.softmax(beta * scores, dim=dim)


def _waits_forever(scores, beta=1.0, dim=-1):
    threading.Event().wait()


def _spins(scores, beta=1.0, dim=-1):
    while True:
        pass


def _wrong_shape(scores, beta=1.0, dim=-1):
    return torch.softmax(beta * scores, dim=dim).sum(dim)


def _wrong_dtype(scores, beta=1.0, dim=-1):
    return torch.softmax(beta * scores, dim=dim).float()


def _wrong_signature(scores):
    return torch.softmax(scores, dim=-1)


def _not_implemented(scores, beta=1.0, dim=-1):
    raise NotImplementedError


@pytest.mark.parametrize(
    "candidate, phrase",
    [
        (_raises, "raised IndexError"),
        (_raises, "scores[100]"),
        (_returns_string, "expected a torch.Tensor, got str"),
        (_returns_nan, "NaN"),
        (_mutates, "in place"),
        (_wrong_shape, "expected shape (5,), got ()"),
        (_wrong_dtype, "expected dtype torch.float64, got torch.float32"),
        (_wrong_signature, "unexpected keyword argument"),
        (42, "expected a function"),
        (nn.Linear, "expected a function"),
    ],
)
def test_student_problems_become_failed_cases(candidate, phrase):
    report = check_soft_argmax(candidate)
    assert isinstance(report, Report)
    assert not report.passed
    assert phrase in str(report), str(report)


def test_time_limit_counts_cpu_seconds():
    # `_spins` never returns: without the limit the test would hang rather than pass.
    report = check_soft_argmax(_spins, timeout=0.5)
    assert not report.passed
    assert "ran over the time limit of 0.5 s of CPU time" in str(report)
    assert all(not r.passed for r in report.results)


def test_waiting_is_not_cpu_time_but_has_a_guard():
    # `_sleeps` waits 0.6 s per case, using no CPU: a 0.5 s CPU limit does not stop it (so a
    # loaded machine, which also makes a case wait, changes no verdict) ...
    report = check_soft_argmax(_sleeps, timeout=0.5)
    assert report.passed, str(report)
    # ... but a case that never finishes is stopped after the wall-time guard (5 s)
    report = check_soft_argmax(_waits_forever, timeout=0.5)
    assert not report.passed
    assert "it waited 5 s without finishing" in str(report)
    assert all(not r.passed for r in report.results)


def test_grader_side_limits_are_wall_time():
    # in the grader the candidate runs in another process: this one only waits
    from attention_course.checks._runner import limits_in_wall_time

    with limits_in_wall_time():
        report = check_soft_argmax(_sleeps, timeout=0.5)
    assert not report.passed
    assert "ran over the time limit of 0.5 s: look for an endless loop" in str(report)


def test_not_implemented_function():
    report = check_soft_argmax(_not_implemented)
    assert len(report.results) == 1
    assert report.results[0].message == NOT_IMPLEMENTED_MESSAGE
    assert report.score == 0.0


class _StubInit(nn.Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True):
        super().__init__()
        raise NotImplementedError


class _StubForward(nn.Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x):
        raise NotImplementedError


class _NoForward(_StubForward):
    forward = nn.Module.forward


@pytest.mark.parametrize("stub", [_StubInit, _StubForward, _NoForward])
def test_not_implemented_class(stub):
    report = check_layer_norm(stub)
    assert len(report.results) == 1
    assert report.results[0].message.startswith(NOT_IMPLEMENTED_MESSAGE)


class _NoSuper(nn.Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True):
        self.weight = nn.Parameter(torch.ones(normalized_shape))


class _WrongInitSignature(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()


class _ForwardReturnsNone(_StubForward):
    def forward(self, x):
        pass


class _NotAModule:
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True):
        pass


@pytest.mark.parametrize(
    "candidate, phrase",
    [
        (_NoSuper, "super().__init__()"),
        (_WrongInitSignature, "TypeError"),
        (_ForwardReturnsNone, "expected a torch.Tensor, got NoneType"),
        (_NotAModule, "does not subclass `nn.Module`"),
        (ac.LayerNorm(8), "got an instance of it"),
        (ac.soft_argmax, "expected a class"),
    ],
)
def test_class_problems_become_failed_cases(candidate, phrase):
    report = check_layer_norm(candidate)
    assert not report.passed
    assert phrase in str(report), str(report)


@pytest.mark.parametrize("target", FUNCTION_TARGETS)
def test_function_checkers_survive_a_crashing_candidate(target):
    def crash(*args, **kwargs):
        raise ZeroDivisionError("boom")

    report = CHECKERS[target](crash)
    assert not report.passed
    assert "raised ZeroDivisionError: boom" in str(report)


@pytest.mark.parametrize("target", CLASS_TARGETS)
def test_class_checkers_survive_an_empty_module(target):
    class Empty(nn.Module):
        def __init__(self, *args, **kwargs):
            super().__init__()

        def forward(self, *args, **kwargs):
            return "nothing"

    report = CHECKERS[target](Empty)
    assert not report.passed
    assert all(not r.passed for r in report.results)


def test_checker_leaves_global_rng_untouched():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    CHECKERS["multi_head_attention"](ac.MultiHeadAttention)
    assert torch.equal(torch.get_rng_state(), before)


# ---------------------------------------------------------------- the report


def _sample_report() -> Report:
    from buggy.attention import soft_argmax_ignores_beta

    return check_soft_argmax(soft_argmax_ignores_beta)


def test_str_lists_cases_with_marks():
    report = _sample_report()
    text = str(report)
    lines = text.splitlines()
    assert lines[0] == f"check_soft_argmax: {report.num_passed}/{len(report.results)} cases passed"
    assert "✓" in text and "✗" in text
    assert lines[-1].startswith("Not passed yet")
    assert repr(report) == text
    assert "0x" not in text  # no memory addresses


def test_passing_report_verdict():
    report = check_soft_argmax(ac.soft_argmax)
    assert str(report).splitlines()[-1] == "All cases pass: well done."
    report.assert_passed()


def test_assert_passed_raises_a_one_line_summary():
    report = _sample_report()
    with pytest.raises(AssertionError) as info:
        report.assert_passed()
    passed = sum(r.passed for r in report.results)
    assert str(info.value).startswith(f"{report.target}: {passed}/{len(report.results)} cases")
    assert "\n" not in str(info.value)


def test_html_is_an_escaped_table():
    report = Report(
        "check_demo",
        [CaseResult("a <b> case", True, ""), CaseResult("other", False, "got <script> & more")],
    )
    html = report._repr_html_()
    assert "<table>" in html and "</table>" in html
    assert html.count("<tr>") == 3  # header + two cases
    assert "&lt;script&gt; &amp; more" in html and "<script>" not in html
    assert "a &lt;b&gt; case" in html
    assert "✓" in html and "✗" in html
    assert "<table>" in _sample_report()._repr_html_()


def test_to_dict_is_json_serialisable():
    report = _sample_report()
    data = json.loads(json.dumps(report.to_dict()))
    assert data["target"] == "check_soft_argmax"
    assert data["passed"] is False
    assert data["score"] == pytest.approx(report.score)
    assert len(data["results"]) == len(report.results)
    assert set(data["results"][0]) == {"name", "passed", "message", "weight", "mistake"}


def test_empty_report_is_not_passed():
    report = Report("check_nothing")
    assert not report.passed and report.score == 0.0


# ---------------------------------------------------------------- scoring and messages


def test_trivial_cases_cannot_carry_a_broken_merge_heads():
    """A merge_heads that crashes on every multi-head case passes only the trivial ones
    (H = 1, T = 1, the round trip): its score stays well under half."""
    from buggy.multihead import merge_heads_view_after_transpose

    report = CHECKERS["merge_heads"](merge_heads_view_after_transpose)
    assert report.num_passed == 3 and len(report.results) == 6
    assert report.score < 0.25


def test_score_is_the_weighted_fraction():
    report = Report(
        "check_demo",
        [CaseResult("hard", False, "x", 1.0), CaseResult("trivial", True, "", 0.25)],
    )
    assert report.score == pytest.approx(0.2)
    assert Report("check_demo", [CaseResult("a", True), CaseResult("b", False)]).score == 0.5


def test_sums_to_one_hint_ignores_fully_masked_rows():
    from attention_course.checks._compare import sums_to_one_hint

    hint = sums_to_one_hint(-1, "the keys")
    good = torch.tensor([[0.25, 0.75], [0.0, 0.0]], dtype=torch.float64)  # row 1 fully masked
    assert hint(good) is None
    bad = torch.tensor([[0.5, 0.75], [0.0, 0.0]], dtype=torch.float64)
    assert "do not sum to 1" in hint(bad)


def test_meta_device_errors_are_not_mistaken_for_a_stub():
    """PyTorch raises NotImplementedError for data on the meta device: that is a failed
    case with a hint, not "not implemented yet"."""
    from buggy.masking import causal_mask_moves_to_cpu

    report = CHECKERS["causal_mask"](causal_mask_moves_to_cpu)
    assert len(report.results) > 1
    assert NOT_IMPLEMENTED_MESSAGE not in str(report)


def test_dropout_case_defers_to_the_eval_cases_when_the_structure_is_wrong():
    """A layer that is wrong without dropout (norms swapped) is not told that its dropout
    is misplaced: the training-mode case says to fix the eval-mode cases first."""
    from buggy.transformer import EncoderNormsSwapped

    report = CHECKERS["encoder_layer"](EncoderNormsSwapped)
    dropout_cases = [r for r in report.results if "training mode, dropout" in r.name]
    assert dropout_cases and not any(r.passed for r in dropout_cases)
    text = "\n".join(r.message for r in dropout_cases)
    assert "already wrong with dropout off" in text or "the same failure" in text
    assert "1 / (1 - p)" not in text and "Dropout belongs" not in text


def test_dtype_message_names_the_usual_cause_once():
    """A float32 result for float64 inputs: one message, no doubled parentheses, and the
    usual cause (a `.float()` cast) named."""
    report = check_soft_argmax(_wrong_dtype)
    text = str(report)
    assert "expected dtype torch.float64, got torch.float32 (the values are right)" in text
    assert "do not cast with `.float()`" in text
    assert ") (" not in text


def _padding_mask_loop(lengths, max_len=None):
    """A correct loop: it reads the values of `lengths` and builds on their device."""
    values = [int(n) for n in lengths]
    device = lengths.device if isinstance(lengths, torch.Tensor) else None
    width = max(values, default=0) if max_len is None else max_len
    mask = torch.zeros(len(values), width, dtype=torch.bool, device=device)
    for b, n in enumerate(values):
        mask[b, :n] = True
    return mask


def test_a_padding_mask_that_reads_the_lengths_is_not_failed_on_the_meta_device():
    """The meta device has no data: code that reads the lengths' values (allowed) cannot be
    checked there, and is told so instead of being failed; moving `lengths` to the CPU is
    still rejected (tests/buggy/masking.py)."""
    report = CHECKERS["padding_mask"](_padding_mask_loop)
    assert report.passed and report.score == 1.0, report
    assert "not checked on this machine" in report.results[-1].message


def test_an_extra_mask_buffer_is_accepted_but_an_extra_parameter_is_not():
    """A nanoGPT-style persistent causal-mask buffer is correct code: the reference weights
    load around it. An extra *parameter* still fails, naming it."""
    from buggy.gpt import CausalBase

    class WithMaskBuffer(CausalBase):
        def __init__(self, d_model, num_heads, bias=False, dropout=0.0, max_len=64):
            super().__init__(d_model, num_heads, bias, dropout)
            self.register_buffer("causal", torch.ones(max_len, max_len, dtype=torch.bool).tril())

        def hidden(self, T, device):
            return ~self.causal[:T, :T]

    class WithExtraParameter(CausalBase):
        def __init__(self, d_model, num_heads, bias=False, dropout=0.0):
            super().__init__(d_model, num_heads, bias, dropout)
            self.gain = nn.Parameter(torch.ones(()))

    report = CHECKERS["causal_self_attention"](WithMaskBuffer)
    assert report.passed and report.score == 1.0, report
    report = CHECKERS["causal_self_attention"](WithExtraParameter)
    assert not report.passed and report.score == 0.0
    assert "unexpected: gain" in str(report)
