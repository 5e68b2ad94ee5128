"""Verdicts a simulated student found wrong or weak (2026-11-26), pinned.

- A built-in the task writes, called inside ``try``/``except`` with a hand-written
  fallback, fails in the check cell (it already scored 0 in the grader's scan).
- The refusal names the function the student's code called.
- "raise ValueError naming the argument" matches the name in any case, and an ``assert``
  gets its own hint.
- Each mask shape is checked in each norm placement of the encoder layer.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attention_course import kv, norms
from attention_course import transformer as ref
from attention_course.checks import (
    check_causal_self_attention,
    check_encoder_layer,
    check_layer_norm,
    check_rms_norm,
    check_sliding_window_mask,
)

sys.path.insert(0, os.path.dirname(__file__))
from buggy.gpt import CausalBase  # noqa: E402


def _failures(report) -> str:
    return "\n".join(f"{r.name}: {r.message}" for r in report.results if not r.passed)


class LayerNormWithFallback(nn.Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True):
        super().__init__()
        self.shape = (
            (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        )
        self.eps = eps
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(self.shape))
            self.bias = nn.Parameter(torch.zeros(self.shape))
        else:
            self.weight = self.bias = None

    def forward(self, x):
        try:
            return F.layer_norm(x, self.shape, self.weight, self.bias, self.eps)
        except Exception:  # noqa: BLE001 - the student's fallback
            dims = tuple(range(-len(self.shape), 0))
            mean = x.mean(dims, keepdim=True)
            var = x.var(dims, keepdim=True, unbiased=False)
            y = (x - mean) / torch.sqrt(var + self.eps)
            return y if self.weight is None else y * self.weight + self.bias


class RMSNormWithFallback(nn.Module):
    def __init__(self, normalized_shape, eps=None, elementwise_affine=True):
        super().__init__()
        self.inner = norms.RMSNorm(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)
        self.weight = self.inner.weight
        self.normalized_shape, self.eps = self.inner.normalized_shape, self.inner.eps

    def forward(self, x):
        try:
            return torch.rms_norm(x, self.normalized_shape, self.weight, self.eps)
        except Exception:  # noqa: BLE001 - the student's fallback
            return self.inner(x)


class AttentionWithFallback(CausalBase):
    """Exercise 13's attention from tensor operations, tried after the built-in."""

    def forward(self, x):
        q, k, v = self.split(self.w_q(x)), self.split(self.w_k(x)), self.split(self.w_v(x))
        p = self.dropout if self.training else 0.0
        try:
            h = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        except Exception:  # noqa: BLE001 - the student's fallback
            h = self.weights(q @ k.transpose(-2, -1) * self.scale()) @ v
        return self.w_o(self.merge(h))


@pytest.mark.parametrize(
    ("check", "candidate", "called"),
    [
        (check_layer_norm, LayerNormWithFallback, "F.layer_norm"),
        (check_rms_norm, RMSNormWithFallback, "torch.rms_norm"),
        (check_causal_self_attention, AttentionWithFallback, "F.scaled_dot_product_attention"),
    ],
)
def test_a_caught_refusal_still_fails(check, candidate, called):
    report = check(candidate)
    assert not report.passed
    text = _failures(report)
    assert f"your code called `{called}` and caught the exception it raised" in text


def test_the_refusal_names_the_function_called():
    class ThroughTheFunctional(AttentionWithFallback):
        def forward(self, x):  # what nn.MultiheadAttention's forward calls
            return F.multi_head_attention_forward(
                x, x, x, 0, 0, None, None, None, None, False, 0.0, None, None
            )

    report = check_causal_self_attention(ThroughTheFunctional)
    assert not report.passed
    assert "(your code called `F.multi_head_attention_forward`)" in _failures(report)


def test_the_reference_still_passes_its_guarded_checkers():
    from attention_course import gpt

    assert check_causal_self_attention(gpt.CausalSelfAttention).passed
    assert check_layer_norm(norms.LayerNorm).passed
    assert check_rms_norm(norms.RMSNorm).passed


def _window_mask(message=None, use_assert=False):
    def sliding_window_mask(size, window, device=None):
        if use_assert:
            assert window >= 1, f"window: got {window}"
        elif window < 1:
            raise ValueError(message.format(window=window))
        return kv.sliding_window_mask(size, window, device=device)

    return sliding_window_mask


def test_value_error_naming_the_argument_in_another_case_passes():
    assert check_sliding_window_mask(_window_mask("Window must be >= 1, got {window}")).passed


def test_value_error_not_naming_the_argument_says_which_name():
    report = check_sliding_window_mask(_window_mask("must be >= 1, got {window}"))
    assert not report.passed
    assert "should name the argument `window`" in _failures(report)


def test_an_assert_gets_told_to_raise_value_error():
    report = check_sliding_window_mask(_window_mask(use_assert=True))
    assert not report.passed
    assert "raise ValueError naming `window`, not assert" in _failures(report)


@pytest.mark.parametrize(
    ("norm_first", "dropped_ndim", "case"),
    [
        (True, 4, "pre-norm with a padding mask (B, 1, 1, T)"),
        (False, 2, "post-norm with a causal mask (T, T)"),
    ],
)
def test_each_mask_shape_is_checked_in_each_norm_placement(norm_first, dropped_ndim, case):
    class DropsOneMaskShape(ref.EncoderLayer):
        def forward(self, x, mask=None, return_attention=False):
            if self.norm_first == norm_first and mask is not None and mask.dim() == dropped_ndim:
                mask = None
            return super().forward(x, mask, return_attention)

    report = check_encoder_layer(DropsOneMaskShape)
    assert not report.passed
    assert case in [r.name for r in report.results if not r.passed]


def test_pre_norm_with_the_norm_on_the_sublayer_output_is_named():
    class NormOnTheOutput(ref.EncoderLayer):
        def forward(self, x, mask=None, return_attention=False):
            if not self.norm_first:
                return super().forward(x, mask, return_attention)
            out, _ = self.self_attn(x, x, x, mask=mask)
            x = x + self.dropout1(self.norm1(out))
            return x + self.dropout2(self.norm2(self.ffn(x)))

    report = check_encoder_layer(NormOnTheOutput)
    assert not report.passed
    assert "pre-norm normalises the sublayer's input, x + sublayer(norm(x))" in _failures(report)
