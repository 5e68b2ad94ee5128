"""Exercise 17's checkers after student report s17: the answer types task 4 accepts, the
task 3 cases that catch a best-mean-layer scan and a hard-coded number of heads, task 2
without a gradient requirement, and the first message each mistake gets."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from attention_course.checks import (
    check_ablation_effect,
    check_attention_rollout,
    check_find_induction_head,
    check_induction_scores,
)
from attention_course.interpret import (
    ablate_heads,
    ablation_effect,
    attention_rollout,
    find_induction_head,
    load_induction_model,
)

sys.path.insert(0, os.path.dirname(__file__))
import buggy.interpret as bug  # noqa: E402


def _first_failure(report) -> str:
    return next(r.message for r in report.results if not r.passed)


# ---------------------------------------------------------------- task 4: a float


@pytest.mark.parametrize(
    "wrap",
    [
        pytest.param(str, id="str"),
        pytest.param(lambda x: torch.tensor([x]), id="tensor (1,)"),
        pytest.param(lambda x: [x], id="list"),
        pytest.param(lambda x: (x,), id="tuple"),
        pytest.param(lambda x: np.array([x]), id="ndarray (1,)"),
        pytest.param(lambda x: x > 0, id="bool"),
    ],
)
def test_ablation_checker_rejects_anything_but_one_real_number(wrap):
    """s17 bugs 1-2: a string and a shape-(1,) tensor passed 6/6 (the checker called
    float()), while [x] and np.array([x]) failed: all of them now fail, naming the type."""

    def answer(model, ids, period, layer, head):
        return wrap(ablation_effect(model, ids, period, layer, head))

    report = check_ablation_effect(answer)
    assert not any(r.passed for r in report.results)
    message = _first_failure(report)
    assert "expected one real number, a float" in message and "`.item()`" in message


@pytest.mark.parametrize(
    "wrap",
    [
        pytest.param(float, id="float"),
        pytest.param(lambda x: torch.tensor(x, dtype=torch.float64), id="0-d tensor"),
        pytest.param(np.float32, id="np.float32"),
        pytest.param(np.array, id="0-d ndarray"),
    ],
)
def test_ablation_checker_accepts_real_numbers(wrap):
    def answer(model, ids, period, layer, head):
        return wrap(ablation_effect(model, ids, period, layer, head))

    assert check_ablation_effect(answer).passed


def test_ablate_heads_names_a_single_pair_and_a_missing_head():
    """s17: `ablate_heads(model, (layer, head))` raised `TypeError: cannot unpack
    non-iterable int object` from inside the package."""
    model = load_induction_model()
    with pytest.raises(TypeError, match=r"single pair \(1, 0\).*\[\(layer, head\)\]"):
        ablate_heads(model, (1, 0))
    with pytest.raises(ValueError, match="2 layers of 4 heads"):
        ablate_heads(model, [(3, 1)])
    with ablate_heads(model, [(np.int64(1), torch.tensor(0))]):  # numpy and 0-d ints
        assert model.blocks[1].attn.w_o.weight[:, :16].abs().sum() == 0


@pytest.mark.parametrize(
    "impl, phrase",
    [
        (bug.ablation_next_head, "ablating head 1 of layer 1: heads are 0-based"),
        (bug.ablation_swapped, "(layer, head) are swapped"),
        (bug.ablation_single_pair, "wrap it, `[(layer, head)]`"),
        (bug.ablation_dh_by_layers, "d_model // num_layers = 32"),
        (bug.ablation_query_rows, "rows of w_q"),
        (bug.ablation_first_sequence, "first sequence only"),
        (bug.ablation_both_inside, "your change is 0"),
    ],
)
def test_ablation_first_message_names_the_mistake(impl, phrase):
    """s17: these got the generic "Hint: zero w_o.weight[:, ...]" (or a raw TypeError)."""
    message = _first_failure(check_ablation_effect(impl))
    assert phrase in message, message
    assert "Hint: zero w_o" not in message


# ---------------------------------------------------------------- task 3: the new cases


def test_find_checker_catches_the_best_mean_layer_and_four_heads():
    """s17 findings 3-4: both passed 7/7; each now fails exactly its own case."""
    report = check_find_induction_head(bug.find_best_mean_layer)
    failed = [r.name for r in report.results if not r.passed]
    assert len(failed) == 1 and "best mean score" in failed[0]
    assert "you chose the layer with the best mean score" in _first_failure(report)
    report = check_find_induction_head(bug.find_four_heads)
    failed = [r.name for r in report.results if not r.passed]
    assert len(failed) == 1 and "8 heads per layer" in failed[0]
    assert "hard-coded 4 heads" in _first_failure(report)


def test_the_new_find_cases_keep_the_shipped_models_function():
    """Both new models are derived from the shipped file, nothing trained: the idle middle
    layer writes nothing (logits equal), the 8-head model equals it up to rounding, and
    their scores are the shipped model's rearranged."""
    from attention_course.checks.interpret import _eval_ids, _scores, _variant

    model = load_induction_model()
    ids = _eval_ids(16)
    scores = _scores(model, ids, 16, 15)
    with torch.no_grad():
        logits = model(ids)
        elsewhere = _variant("best head outside the best-mean layer")
        assert torch.equal(elsewhere(ids), logits)
        wide = _variant("8 heads")
        assert wide.num_heads == 8 and wide.d_model == 2 * model.d_model
        torch.testing.assert_close(wide(ids), logits, atol=1e-4, rtol=1e-4)
    s = _scores(elsewhere, ids, 16, 15)
    best, second = scores[1].sort(descending=True).values[:2]
    assert s.shape == (3, 4) and torch.allclose(s[1], second.expand(4))
    assert s[1].mean() > s[2].mean() and best - second > 0.01  # beyond the check's tie
    assert find_induction_head(elsewhere, ids, 16) == (2, int(scores[1].argmax()))
    s = _scores(wide, ids, 16, 15)
    torch.testing.assert_close(s, torch.cat([scores, scores], dim=1), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "impl, phrase, wrong",
    [
        (bug.find_fully_one_based, "layers and heads counted from 1", "fixed in advance"),
        (bug.find_flat_index_as_head, "flat index of the best score", "fixed in advance"),
        (bug.find_first_two_layers, "scanned only layers 0 .. 1", "scanned only layer 0"),
        (bug.find_bools, "True/False are truth values", None),
        (bug.find_first_sequence, "first sequence only", "fixed in advance"),
    ],
)
def test_find_messages_name_the_mistake_in_every_failing_case(impl, phrase, wrong):
    """s17: a fully 1-based answer and a flat index got "an answer fixed in advance" on the
    renumbered cases, range(2) on three layers got "you scanned only layer 0", bools got
    "expected two ints"."""
    report = check_find_induction_head(impl)
    messages = [
        r.message for r in report.results if not r.passed and "same failure" not in r.message
    ]
    assert messages and phrase in messages[0]
    if wrong is not None:
        assert not any(wrong in m for m in messages), messages


# ---------------------------------------------------------------- task 1


def test_induction_first_message_does_not_guess_on_the_perfect_head():
    """s17 (scored 0): reading i - period + 2 was told "your score reads the weight on
    i - period" on the perfect head, where both reads give 0. The message now names the
    reads this case cannot tell apart; a later case names the right one."""
    report = check_induction_scores(bug.induction_plus_two)
    failing = [r.message for r in report.results if not r.passed]
    assert "one of several mistakes" in failing[0] and "i - period + 2" in failing[0]
    assert "Likely mistake: your score reads the weight on i - period," not in failing[0]
    assert any(
        "Likely mistake: your score reads the weight on i - period + 2" in m for m in failing
    )
    # the transposed read is still named outright (its probe tells it apart)
    assert _first_failure(check_induction_scores(bug.induction_transposed)).count(
        "Likely mistake: your score reads the transposed entries"
    )


# ---------------------------------------------------------------- task 2


def test_rollout_checker_accepts_no_grad_and_numpy():
    """s17 finding 5: the statement never asked for gradients (chapter 17 computes rollout
    under no_grad), but a no_grad rollout failed the gradient case. The case is gone and
    the statement says no_grad is fine."""

    @torch.no_grad()
    def no_grad(attentions):
        return attention_rollout(attentions)

    def in_numpy(attentions):
        result = None
        for w in attentions:
            a = w.detach().numpy().mean(axis=1) + np.eye(
                w.shape[-1], dtype=w.detach().numpy().dtype
            )
            a = a / a.sum(axis=-1, keepdims=True)
            result = a if result is None else a @ result
        return torch.from_numpy(result)

    assert check_attention_rollout(no_grad).passed
    assert check_attention_rollout(in_numpy).passed


@pytest.mark.parametrize(
    "check, impl, phrase",
    [
        (check_induction_scores, bug.induction_half_as_period, "T // 2 as the period"),
        (check_induction_scores, bug.induction_skips_period_entries, "skips too many queries"),
        (check_induction_scores, bug.induction_max_over_batch, "max over the batch"),
        (check_induction_scores, bug.induction_first_sequence, "first sequence of the batch"),
        (check_induction_scores, bug.induction_mean_over_heads, "heads instead of the batch"),
        (check_attention_rollout, bug.rollout_elementwise, "elementwise (`*`)"),
        (check_attention_rollout, bug.rollout_head_zero, "head 0 only"),
        (check_attention_rollout, bug.rollout_identity_first_layer_only, "first layer only"),
        (check_attention_rollout, bug.rollout_no_renormalisation, "rows sum to 2, not 1"),
    ],
)
def test_tasks_1_and_2_name_the_mistakes_s17_found_undiagnosed(check, impl, phrase):
    """s17 scored these 1/2: a failing case with no diagnosis (or, for the missing
    renormalisation, a description that did not fit renormalising before adding I)."""
    report = check(impl)
    named = [r.message for r in report.results if not r.passed and "Likely mistake" in r.message]
    assert any(phrase in m for m in named), str(report)
