"""Chapter 14's exercise checks beyond the buggy catalogue: the computed question
``14.rope_attention`` (RoPE inside attention, where rotating the values can be seen) and
the shift invariance chapter 14 states."""

from __future__ import annotations

import math

import pytest
import torch

from attention_course import apply_rope
from attention_course.quiz import check_quiz


def _attention(q, k, v, *, rotate="qk", causal=True, scaled=True):
    T = q.shape[-2]
    q = apply_rope(q) if "q" in rotate else q
    k = apply_rope(k) if "k" in rotate else k
    v = apply_rope(v) if "v" in rotate else v
    scores = q @ k.transpose(-2, -1)
    if scaled:
        scores = scores / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


def test_rope_attention_accepts_the_solution():
    report = check_quiz("14.rope_attention", _attention)
    assert report.passed, report


@pytest.mark.parametrize(
    "options, named",
    [
        ({"rotate": "qkv"}, "RoPE is applied to the values as well"),
        ({"rotate": "q"}, "only the queries are rotated"),
        ({"rotate": "k"}, "only the keys are rotated"),
        ({"rotate": ""}, "no rotation"),
        ({"causal": False}, "no causal mask"),
        ({"scaled": False}, "not divided by sqrt(Dh)"),
    ],
)
def test_rope_attention_names_the_mistake(options, named):
    report = check_quiz("14.rope_attention", lambda q, k, v: _attention(q, k, v, **options))
    assert not report.passed
    assert named in str(report), str(report)


def test_a_rope_score_does_not_change_when_both_positions_shift():
    """Chapter 14's claim (positions from 1 change no score inside attention) holds
    numerically."""
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 16, generator=gen, dtype=torch.float64)

    def score(m, n):
        Q = apply_rope(q[None], torch.tensor([m]))
        K = apply_rope(k[None], torch.tensor([n]))
        return float(Q @ K.T)

    for shift in (1, 7, 1000):
        assert score(5 + shift, 2 + shift) == pytest.approx(score(5, 2), abs=1e-9)


def test_every_chapter_14_mistake_scores_below_0_9():
    """A wrong apply_rope or alibi_slopes never gets (nearly) full marks: a case that alone
    tests a requirement carries enough weight (the student found H = 1 at 0.96)."""
    import os
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from buggy.relative_positions import CATALOGUE

    from attention_course.checks import CHECKERS

    for target, name, impl, _ in CATALOGUE:
        score = CHECKERS[target](impl).score
        assert score < 0.9, (name, score)


@pytest.mark.parametrize(
    "options, named",
    [
        ({"scaled": "Dh"}, "divided by Dh instead of sqrt(Dh)"),
        ({"causal": "reversed"}, "the mask is reversed"),
        ({"causal": "diagonal"}, "the mask hides the diagonal too"),
        ({"fill": 0.0}, "masked scores set to 0 still get weight"),
        ({"softmax_dim": -2}, "the softmax runs over the queries"),
    ],
)
def test_rope_attention_names_the_attention_slips(options, named):
    from attention_course.checks.quiz_computed import _rope_attend

    report = check_quiz("14.rope_attention", lambda q, k, v: _rope_attend(q, k, v, **options))
    assert not report.passed
    assert named in str(report), str(report)
