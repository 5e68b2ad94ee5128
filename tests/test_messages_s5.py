"""Messages a simulated student scored 0 (issue 25's closing notes), pinned.

- Exercise 05: a ``causal_mask`` that masks nothing (all True) was told "the mask includes
  one future position": at size 2, the first failing case, ``tril(1)`` is all True too.
  It is now named for what it is, in every failing case.
- Exercise 07: a LayerNorm over the token axis (``dim=-2``) was counted in the grader's
  per-task summary as "you normalised over the batch axis (dim=0): that is BatchNorm",
  from the 2-D (N, D) case, where dim -2 is dim 0. Each wrong axis is now named for what it
  is, and the (N, D) case names both readings.
- The feedback's first hint (tier 1) came from a pattern on the named mistake that ignored
  the task: "swapped" gave the sinusoidal encoding's sines hint to LayerNorm's weight and
  bias, norm1/norm2, RoPE and (layer, head); "unbiased" told BatchNorm's running_var,
  which should be unbiased, to "divide by the biased variance"; "dim=-2" gave LayerNorm
  the softmax-over-the-keys hint.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from attention_course.checks import CHECKERS

sys.path.insert(0, os.path.dirname(__file__))
from buggy import CATALOGUE  # noqa: E402
from buggy.masking import causal_mask_all_true  # noqa: E402
from buggy.norms import LayerNormBatchAxis, LayerNormTokenAxis, _LayerNormBase  # noqa: E402

SINES = "The even features carry sines"
BIASED = "Normalisation layers divide by the biased variance"
ROWS = "Each query distributes its attention over the keys"


def _catalogued(target: str, name: str):
    (impl,) = [i for t, n, i, _ in CATALOGUE if (t, n) == (target, name)]
    return impl


# ---------------------------------------------------------------- 05: an all-True mask


def test_an_all_true_causal_mask_is_named_as_no_masking():
    report = CHECKERS["causal_mask"](causal_mask_all_true)
    failing = [r for r in report.results if not r.passed]
    assert failing and failing[0].name == "size 2"
    for result in failing:
        assert "Likely mistake" in result.message, result.message
        assert "the mask is all True" in result.message, result.message
        assert "one future position" not in result.message, result.message


def test_one_future_position_is_still_named_where_it_is_the_mistake():
    def tril_one(size, device=None):
        return torch.ones(size, size, dtype=torch.bool, device=device).tril(1)

    messages = [r.message for r in CHECKERS["causal_mask"](tril_one).results if not r.passed]
    assert messages and all("one future position" in m for m in messages)
    assert not any("all True" in m for m in messages)


# ---------------------------------------------------------------- 07: the grader's summary


def _summary(target: str, points: float, impl) -> list[str]:
    """The grader's per-task summary of a class of one submission: its mistake lines."""
    from attention_course.grading import grade as grading
    from attention_course.grading import gradebook

    report = CHECKERS[target](impl).to_dict()
    task = grading.TaskGrade(target, "check", target, points, report=report)
    entry = gradebook.Entry(Path("s.ipynb"), grading.Grade("s", "07", [task], [], 60))
    (row,) = gradebook.summary([entry])
    return [m["mistake"] for m in row["common_mistakes"]]


def test_layer_norm_over_the_token_axis_is_not_summarised_as_batchnorm():
    pytest.importorskip("nbformat")
    lines = _summary("layer_norm", 3, LayerNormTokenAxis)
    assert lines and not any("BatchNorm" in line for line in lines), lines
    assert any("the tokens of a (B, T, D) input" in line for line in lines), lines


def test_layer_norm_over_the_batch_axis_is_still_called_batchnorm():
    pytest.importorskip("nbformat")
    lines = _summary("layer_norm", 3, LayerNormBatchAxis)
    assert any("that is BatchNorm" in line for line in lines), lines


# ---------------------------------------------------------------- tier-1 hints


class _LayerNormWeightBiasSwapped(_LayerNormBase):
    def forward(self, x):
        return self.normalise(x) * self.bias + self.weight


@pytest.mark.parametrize(
    ("target", "impl", "wrong"),
    [
        ("layer_norm", _LayerNormWeightBiasSwapped, SINES),
        ("layer_norm", LayerNormTokenAxis, ROWS),
        ("batch_norm", _catalogued("batch_norm", "running var biased"), BIASED),
        ("encoder_layer", _catalogued("encoder_layer", "norms swapped"), SINES),
        ("decoder_layer", _catalogued("decoder_layer", "self/cross swapped"), SINES),
        ("apply_rope", _catalogued("apply_rope", "cos/sin swapped"), SINES),
        ("ablation_effect", _catalogued("ablation_effect", "(head, layer)"), SINES),
        ("rms_norm", _catalogued("rms_norm", "biased x.var()"), BIASED),
    ],
    ids=lambda v: v if isinstance(v, str) else getattr(v, "__name__", "impl"),
)
def test_the_first_hint_is_about_the_tasks_own_mistake(target, impl, wrong):
    report = CHECKERS[target](impl)
    assert not report.passed
    first = report.hint(1)
    assert wrong not in first, first
    assert wrong not in report.hint(3)


@pytest.mark.parametrize(
    ("target", "name", "right"),
    [
        ("layer_norm", "unbiased variance", BIASED),
        ("sinusoidal_positional_encoding", "sin/cos swapped", SINES),
        ("scaled_dot_product_attention", "softmax over queries", ROWS),
        ("batch_norm", "unbiased normalisation", "only the running_var it keeps"),
    ],
)
def test_the_hand_written_hints_stay_where_they_belong(target, name, right):
    assert right in CHECKERS[target](_catalogued(target, name)).hint(1)
