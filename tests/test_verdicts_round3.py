"""Verdicts and messages a simulated student found wrong or weak (issue 24, sections 1 and 4),
pinned. Each test failed on the code before the fix.

- 07: BatchNorm running statistics updated outside ``torch.no_grad()`` passed; LayerNorm
  under ``no_grad`` never named it.
- 08: a correct FFN forward written with ``einsum`` on ``self.linear1.weight`` was rejected.
- 14, 16: float64 inputs computed in float32 inside passed (float64 tolerance 1e-6).
- 13.2: dropout on the masked scores and a mask in training mode only were not named.
- 04, 05, 01, 15.2, 10: first failing messages that did not name the mistake.
"""

from __future__ import annotations

import copy
import os
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attention_course as ac
from attention_course.checks import (
    check_apply_rope,
    check_batch_norm,
    check_causal_mask,
    check_causal_self_attention,
    check_encoder_layer,
    check_layer_norm,
    check_padding_mask,
    check_positionwise_feed_forward,
    check_rms_norm,
    check_scaled_dot_product_attention,
    check_set_attention,
    check_sliding_window_mask,
    check_soft_argmax,
    check_swiglu,
)
from attention_course.checks._registry import CHECKERS

sys.path.insert(0, os.path.dirname(__file__))
from buggy import attention as buggy_attention  # noqa: E402
from buggy import gpt as buggy_gpt  # noqa: E402
from buggy import kv as buggy_kv  # noqa: E402
from buggy import masking as buggy_masking  # noqa: E402
from buggy import modern as buggy_modern  # noqa: E402
from buggy import names  # noqa: E402
from buggy import norms as buggy_norms  # noqa: E402
from buggy import relative_positions as buggy_positions  # noqa: E402

ROUND3 = [
    *buggy_norms.ROUND3,
    *buggy_masking.ROUND3,
    *buggy_kv.ROUND3,
    *buggy_attention.ROUND3,
    *buggy_gpt.ROUND3,
    *buggy_positions.ROUND3,
    *buggy_modern.ROUND3,
]


def _first_failure(report):
    return next(r for r in report.results if not r.passed)


def _failures(report) -> str:
    return "\n".join(f"{r.name}: {r.message}" for r in report.results if not r.passed)


@pytest.mark.parametrize(
    "target, name, impl, phrase", ROUND3, ids=[f"{t}-{n}" for t, n, _, _ in ROUND3]
)
def test_round3_mistake_is_rejected_and_named(target, name, impl, phrase):
    report = CHECKERS[target](impl)
    assert not report.passed, f"{name} was accepted:\n{report}"
    assert names(report, phrase), f"expected {phrase!r} named in:\n{report}"


# ---------------------------------------------------------------- 07: BatchNorm, LayerNorm


def test_batch_norm_buffers_updated_with_grad_fail_with_the_fix_named():
    for impl in (
        buggy_norms.BatchNormUpdatesOutsideNoGrad,
        buggy_norms.BatchNormRebindsRunningStats,
    ):
        report = check_batch_norm(impl)
        failed = [r for r in report.results if not r.passed]
        assert [r.name for r in failed] == ["running statistics stay out of the autograd graph"]
        message = failed[0].message
        assert "grad_fn" in message and "torch.no_grad()" in message and ".detach()" in message


def test_batch_norm_reference_keeps_buffers_out_of_the_graph():
    # what the new case checks, on the reference: the buffers stay buffers, without grad,
    # and the module can be deep-copied after a training step on an input that requires grad
    bn = ac.BatchNorm1d(3).double()
    bn(torch.randn(4, 3, dtype=torch.float64, requires_grad=True)).sum().backward()
    buffers = dict(bn.named_buffers())
    assert not buffers["running_mean"].requires_grad and buffers["running_mean"].grad_fn is None
    copy.deepcopy(bn)
    assert check_batch_norm(ac.BatchNorm1d).passed


def test_layer_norm_under_no_grad_names_no_grad():
    for impl in (buggy_norms.LayerNormStatsUnderNoGrad, buggy_norms.LayerNormForwardUnderNoGrad):
        message = _first_failure(check_layer_norm(impl)).message
        assert "torch.no_grad()" in message, message


# ---------------------------------------------------------------- 08: FFN written with einsum


class FFNEinsum(nn.Module):
    """A correct FFN whose forward uses the weights of linear1 and linear2 directly."""

    def __init__(self, d_model, d_ff, dropout=0.0, activation="relu"):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = activation

    def forward(self, x):
        h = torch.einsum("...d,fd->...f", x, self.linear1.weight) + self.linear1.bias
        h = F.relu(h) if self.activation == "relu" else F.gelu(h)
        h = self.dropout(h)
        return torch.einsum("...f,df->...d", h, self.linear2.weight) + self.linear2.bias


class FFNEinsumDropoutOnOutput(FFNEinsum):
    """The einsum FFN with dropout moved after linear2."""

    def forward(self, x):
        h = torch.einsum("...d,fd->...f", x, self.linear1.weight) + self.linear1.bias
        h = F.relu(h) if self.activation == "relu" else F.gelu(h)
        out = torch.einsum("...f,df->...d", h, self.linear2.weight) + self.linear2.bias
        return self.dropout(out)


class FFNEinsumNoDropout(FFNEinsum):
    """The einsum FFN that never applies dropout."""

    def forward(self, x):
        h = torch.einsum("...d,fd->...f", x, self.linear1.weight) + self.linear1.bias
        h = F.relu(h) if self.activation == "relu" else F.gelu(h)
        return torch.einsum("...f,df->...d", h, self.linear2.weight) + self.linear2.bias


def test_ffn_written_with_einsum_passes():
    report = check_positionwise_feed_forward(FFNEinsum)
    assert report.passed, str(report)


def test_ffn_dropout_mistakes_are_named_without_the_module_hook():
    message = _failures(check_positionwise_feed_forward(FFNEinsumDropoutOnOutput))
    assert "dropout is applied after linear2" in message, message
    message = _failures(check_positionwise_feed_forward(FFNEinsumNoDropout))
    assert "the `dropout` argument is ignored" in message, message


# ---------------------------------------------------------------- 14, 16: float32 inside


@pytest.mark.parametrize(
    "check, impl",
    [
        (check_apply_rope, buggy_positions.rope_computed_in_float32),
        (check_rms_norm, buggy_modern.RMSNormUpcastsToFloat32),
        (check_swiglu, buggy_modern.SwiGLUGateInFloat32),
    ],
)
def test_float64_computed_in_float32_inside_is_rejected_by_name(check, impl):
    message = _first_failure(check(impl)).message
    assert "computed in float32 inside" in message, message


def test_layer_norm_in_float32_is_named_as_such():
    message = _first_failure(check_layer_norm(buggy_norms.LayerNormCastsToFloat32)).message
    assert "computed in float32 inside" in message, message


def test_float64_tolerance_is_float64s():
    from attention_course.checks._compare import tolerances

    atol, rtol = tolerances(torch.float64)
    assert atol <= 1e-10 and rtol <= 1e-10


# ---------------------------------------------------------------- 13.2: dropout and the mask


def test_dropout_on_the_masked_scores_is_named():
    report = check_causal_self_attention(buggy_gpt.CausalDropoutOnMaskedScores)
    failed = [r for r in report.results if not r.passed]
    assert [r.name for r in failed] == [
        "training mode, dropout=0.2: the attention weights are dropped out"
    ]
    assert "dropout is applied to the scores after the mask" in failed[0].message
    assert "NaN" in failed[0].message


def test_mask_in_training_mode_only_is_named_in_eval_cases():
    report = check_causal_self_attention(buggy_gpt.CausalMaskInTrainingOnly)
    first = _first_failure(report)
    assert "in training mode only" in first.message, first.message
    assert "self.training" in first.message


# ---------------------------------------------------------------- section 4: messages


def test_sdpa_dropout_on_the_output_is_named():
    report = check_scaled_dot_product_attention(buggy_attention.sdpa_dropout_on_output)
    message = _first_failure(report).message
    assert "dropout is applied to the output" in message, message
    assert "weights from before dropout" not in message


def test_inverted_causal_mask_first_failure_names_inversion():
    first = _first_failure(check_causal_mask(buggy_masking.causal_mask_greater))
    assert first.name == "size 1"
    assert "the mask is inverted" in first.message, first.message
    assert "diagonal is excluded" not in first.message


def test_causal_mask_without_diagonal_is_still_named_at_size_1():
    first = _first_failure(
        check_causal_mask(
            lambda size, device=None: torch.ones(size, size, dtype=torch.bool, device=device).tril(
                -1
            )
        )
    )
    assert "the diagonal is excluded" in first.message, first.message


def test_padding_mask_arange_on_the_cpu_names_the_device():
    report = check_padding_mask(buggy_masking.padding_mask_arange_on_cpu)
    failed = [r for r in report.results if not r.passed]
    assert [r.name for r in failed] == ["the mask goes on the device of `lengths` (meta device)"]
    assert "device=lengths.device" in failed[0].message
    assert "is not on the expected device" not in failed[0].message.splitlines()[0]


def _soft_argmax_hint_messages():
    yield _first_failure(check_soft_argmax(buggy_attention.soft_argmax_unshifted_sum)).message

    def zeros(scores, beta=1.0, dim=-1):
        return torch.zeros_like(scores)

    yield _first_failure(check_soft_argmax(zeros)).message

    def set_attention_rows_not_normalised(X, beta=1.0, hard=False):
        e = torch.exp(beta * X @ X.transpose(-2, -1))
        A = e / e.sum()
        return A @ X, A

    yield _first_failure(check_set_attention(set_attention_rows_not_normalised)).message


def test_soft_argmax_hints_do_not_mention_masks():
    for message in _soft_argmax_hint_messages():
        assert "Hint:" in message, message
        assert "mask" not in message, message


def test_sliding_window_first_failure_names_the_mistake():
    first = _first_failure(check_sliding_window_mask(buggy_kv.window_mask_too_narrow))
    assert first.name == "size 1, window 1"
    assert "one too narrow" in first.message, first.message


class EncoderPassesBadMask(nn.Module):
    """A post-norm encoder layer whose self-attention call gives the mask an extra axis:
    the given MultiHeadAttention raises ValueError inside the package."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.1, norm_first=False):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = ac.MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.ffn = ac.PositionwiseFeedForward(d_model, d_ff, dropout=dropout)
        self.norm1, self.norm2 = ac.LayerNorm(d_model), ac.LayerNorm(d_model)
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, x, mask=None, return_attention=False):
        if mask is not None:
            mask = mask[..., None]  # the student's line
        h, weights = self.self_attn(x, x, x, mask=mask)
        x = self.norm1(x + self.dropout1(h))
        x = self.norm2(x + self.dropout2(self.ffn(x)))
        return (x, weights) if return_attention else x


def test_error_inside_the_package_is_reported_at_the_students_line():
    report = check_encoder_layer(EncoderPassesBadMask)
    messages = [r.message for r in report.results if "raised ValueError" in r.message]
    assert messages, str(report)
    for message in messages:
        assert "in check_mask" not in message, message
        assert "in forward: h, weights = self.self_attn(x, x, x, mask=mask)" in message, message


# ---------------------------------------------------------------- the grader's proxies


def _thread_session(namespace: dict):
    """A session whose "kernel" is a thread of this process (as in test_isolation)."""
    import threading

    from attention_course.grading import sandbox

    def execute(source: str) -> str:
        threading.Thread(target=exec, args=(source, namespace), daemon=True).start()
        return "thread"

    return sandbox.Session(execute, lambda: None, lambda: True, limit=30.0)


_HERE = os.path.dirname(__file__)


@pytest.mark.parametrize(
    "check, module, name",
    [
        (check_batch_norm, "norms", "BatchNormRebindsRunningStats"),
        (check_batch_norm, "norms", "BatchNormUpdatesOutsideNoGrad"),
        (check_layer_norm, "norms", "LayerNormStatsUnderNoGrad"),
        (check_causal_self_attention, "gpt", "CausalMaskInTrainingOnly"),
        (check_causal_self_attention, "gpt", "CausalDropoutOnMaskedScores"),
    ],
)
def test_the_new_cases_grade_alike_through_the_proxies(check, module, name):
    """The grader runs the student's module in a kernel and sees it through proxies: the
    new cases (buffers' requires_grad, the gradient of x, train()/eval()) report the same
    there as in-process."""
    import linecache

    path = os.path.join(_HERE, "buggy", f"{module}.py")
    with open(path) as handle:
        source = handle.read()
    linecache.cache[path] = (len(source), None, source.splitlines(True), path)
    namespace: dict = {"__name__": f"buggy_{module}"}
    exec(compile(source, path, "exec"), namespace)
    expected = check(namespace[name]).to_dict()
    with _thread_session(namespace) as client:
        proxy, _ = client.lookup(name)
        got = check(proxy).to_dict()
    assert got == expected
    assert not expected["passed"]


def test_the_students_line_through_the_proxies():
    import inspect
    import linecache

    source = "import attention_course as ac\nfrom torch import nn\n\n" + inspect.getsource(
        EncoderPassesBadMask
    )
    name = "<student cell>"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    namespace: dict = {"__name__": "__main__"}
    exec(compile(source, name, "exec"), namespace)
    with _thread_session(namespace) as client:
        proxy, _ = client.lookup("EncoderPassesBadMask")
        report = check_encoder_layer(proxy)
    messages = [r.message for r in report.results if "raised ValueError" in r.message]
    assert messages, str(report)
    for message in messages:
        assert "in check_mask" not in message, message
        assert "in forward: h, weights = self.self_attn(x, x, x, mask=mask)" in message, message


def test_an_epsilon_off_by_less_than_float32_is_named_as_a_constant_not_float32():
    def soft_argmax_with_epsilon(scores, beta=1.0, dim=-1):
        scaled = beta * scores
        e = torch.exp(scaled - scaled.amax(dim, keepdim=True))
        return e / (e.sum(dim, keepdim=True) + 1e-9)

    message = _first_failure(check_soft_argmax(soft_argmax_with_epsilon)).message
    assert "a small constant that the formula does not have" in message, message
    assert "float32 inside" not in message
