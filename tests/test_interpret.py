"""Attention rollout, induction scores and the repeated-token task (chapter 17)."""

import pytest
import torch

from attention_course import attention_rollout, induction_scores
from attention_course.data import repeated_tokens


def _random_weights(B, H, T, generator, causal=False):
    scores = torch.randn(B, H, T, T, generator=generator, dtype=torch.float64)
    if causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(dim=-1)


# ---------------------------------------------------------------- induction_scores


def test_induction_scores_one_for_a_perfect_induction_head():
    B, H, T, period = 3, 4, 12, 6
    w = torch.zeros(B, H, T, T)
    w[:, :, torch.arange(T), 0] = 1.0  # heads 1..3: all weight on the first token
    for i in range(period, T):  # head 0: exactly i -> i - period + 1
        w[:, 0, i, 0] = 0.0
        w[:, 0, i, i - period + 1] = 1.0
    scores = induction_scores(w, period)
    assert scores.shape == (H,)
    assert scores[0].item() == 1.0
    assert torch.equal(scores[1:], torch.zeros(H - 1))


@pytest.mark.parametrize("period, T", [(1, 5), (3, 6), (5, 10), (4, 11)])
def test_induction_scores_uniform_causal_weights(period, T):
    # Row i of uniform causal weights is 1 / (i + 1) on j <= i.
    w = torch.ones(T, T, dtype=torch.float64).tril()
    w = (w / w.sum(-1, keepdim=True)).expand(2, 3, T, T)
    expected = sum(1.0 / (i + 1) for i in range(period, T)) / (T - period)
    torch.testing.assert_close(
        induction_scores(w, period), torch.full((3,), expected, dtype=torch.float64)
    )


def test_induction_scores_against_a_loop():
    g = torch.Generator().manual_seed(0)
    B, H, T, period = 2, 3, 9, 4
    w = _random_weights(B, H, T, g, causal=True)
    expected = torch.zeros(H, dtype=torch.float64)
    for h in range(H):
        values = [w[b, h, i, i - period + 1] for b in range(B) for i in range(period, T)]
        expected[h] = sum(values) / len(values)
    torch.testing.assert_close(induction_scores(w, period), expected)


@pytest.mark.parametrize(
    "weights, period, argument",
    [
        (torch.rand(3, 4, 4), 2, "weights"),  # 3-D
        (torch.rand(1, 2, 4, 5), 2, "weights"),  # not square
        (torch.ones(1, 2, 4, 4, dtype=torch.long), 2, "weights"),  # not float
        (torch.rand(1, 2, 4, 4), 0, "period"),
        (torch.rand(1, 2, 4, 4), 4, "period"),  # period >= T
        (torch.rand(1, 2, 4, 4), 2.0, "period"),
    ],
)
def test_induction_scores_validation(weights, period, argument):
    with pytest.raises(ValueError, match=rf"^{argument}"):
        induction_scores(weights, period)


# ---------------------------------------------------------------- attention_rollout


def _rollout_loop(attentions):
    """From scratch, element by element: A_l = 0.5 * mean_h W_l + 0.5 * I (rows of W sum
    to 1), R = A_L @ ... @ A_1."""
    B, _, T, _ = attentions[0].shape
    result = torch.zeros(B, T, T, dtype=attentions[0].dtype)
    for b in range(B):
        mats = []
        for w in attentions:
            H = w.shape[1]
            a = [
                [0.5 * sum(w[b, h, i, j] for h in range(H)) / H for j in range(T)] for i in range(T)
            ]
            for i in range(T):
                a[i][i] += 0.5
            mats.append(a)
        rollout = mats[0]
        for a in mats[1:]:  # R_l = A_l @ R_{l-1}
            rollout = [
                [sum(a[i][k] * rollout[k][j] for k in range(T)) for j in range(T)] for i in range(T)
            ]
        result[b] = torch.tensor([[float(x) for x in row] for row in rollout], dtype=result.dtype)
    return result


@pytest.mark.parametrize("num_layers, heads, causal", [(1, [2], False), (3, [2, 1, 4], True)])
def test_attention_rollout_against_a_loop(num_layers, heads, causal):
    g = torch.Generator().manual_seed(1)
    attentions = [_random_weights(2, h, 5, g, causal=causal) for h in heads]
    out = attention_rollout(attentions)
    assert out.shape == (2, 5, 5) and out.dtype == torch.float64
    torch.testing.assert_close(out, _rollout_loop(attentions))
    torch.testing.assert_close(out.sum(-1), torch.ones(2, 5, dtype=torch.float64))
    if causal:  # a product of lower-triangular matrices stays lower-triangular
        assert torch.equal(out.triu(1), torch.zeros_like(out))


def test_attention_rollout_order_matters():
    g = torch.Generator().manual_seed(2)
    w1, w2 = _random_weights(1, 2, 4, g), _random_weights(1, 2, 4, g)
    eye = torch.eye(4, dtype=torch.float64)
    a1, a2 = (w1.mean(1) + eye) / 2, (w2.mean(1) + eye) / 2
    out = attention_rollout([w1, w2])
    torch.testing.assert_close(out, a2 @ a1)
    assert not torch.allclose(out, a1 @ a2)


def test_attention_rollout_identity_attentions():
    eye = torch.eye(6).expand(2, 3, 6, 6)
    torch.testing.assert_close(attention_rollout([eye, eye, eye]), torch.eye(6).expand(2, 6, 6))


def test_attention_rollout_renormalises_rows_that_do_not_sum_to_one():
    w = torch.full((1, 1, 3, 3), 2.0)  # rows sum to 6: W + I has rows summing to 7
    expected = (torch.full((3, 3), 2.0) + torch.eye(3)) / 7.0
    torch.testing.assert_close(attention_rollout([w])[0], expected)


def test_attention_rollout_does_not_modify_inputs():
    g = torch.Generator().manual_seed(3)
    attentions = [_random_weights(1, 2, 4, g) for _ in range(2)]
    copies = [w.clone() for w in attentions]
    attention_rollout(attentions)
    assert all(torch.equal(w, c) for w, c in zip(attentions, copies))


@pytest.mark.parametrize(
    "attentions, argument",
    [
        ([], "attentions"),
        (torch.rand(2, 1, 3, 3), "attentions"),  # a tensor, not a list
        ([torch.rand(1, 3, 3)], r"attentions\[0\]"),  # 3-D
        ([torch.rand(1, 1, 3, 4)], r"attentions\[0\]"),  # not square
        ([torch.rand(1, 1, 3, 3), torch.rand(1, 1, 4, 4)], r"attentions\[1\]"),  # T differs
        ([torch.rand(1, 1, 3, 3), torch.rand(2, 1, 3, 3)], r"attentions\[1\]"),  # B differs
    ],
)
def test_attention_rollout_validation(attentions, argument):
    with pytest.raises(ValueError, match=rf"^{argument}"):
        attention_rollout(attentions)


# ---------------------------------------------------------------- repeated_tokens


def test_repeated_tokens_shape_and_repetition():
    ids = repeated_tokens(5, 7, 11, generator=torch.Generator().manual_seed(0))
    assert ids.shape == (5, 14) and ids.dtype == torch.long
    assert torch.equal(ids[:, 7:], ids[:, :7])
    assert ids.min() >= 0 and ids.max() < 11


def test_repeated_tokens_seeded():
    a = repeated_tokens(4, 8, 50, generator=torch.Generator().manual_seed(3))
    b = repeated_tokens(4, 8, 50, generator=torch.Generator().manual_seed(3))
    c = repeated_tokens(4, 8, 50, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize(
    "args, argument",
    [((0, 3, 5), "num_sequences"), ((2, 0, 5), "period"), ((2, 3, 0), "vocab_size")],
)
def test_repeated_tokens_validation(args, argument):
    with pytest.raises(ValueError, match=rf"^{argument}"):
        repeated_tokens(*args)


def test_induction_head_on_repeated_tokens_scores_one():
    # An oracle head built from the data: at i >= period attend to i - period + 1.
    period = 5
    ids = repeated_tokens(3, period, 7, generator=torch.Generator().manual_seed(5))
    T = ids.shape[1]
    w = torch.zeros(3, 1, T, T)
    for i in range(T):
        w[:, 0, i, i - period + 1 if i >= period else i] = 1.0
    assert ids[:, period:].eq(ids[:, :period]).all()
    assert induction_scores(w, period).item() == 1.0


def test_checker_accepts_the_papers_half_and_half_form():
    """0.5 W + 0.5 I is the paper's form: equal values, and gradients that differ from the
    renormalised form only by a per-row constant, which the softmax behind real weights
    removes (a simulated student's correct answer was once failed on its gradient)."""
    from attention_course.checks import check_attention_rollout

    def half_and_half(attentions):
        rollout = None
        for a in attentions:
            w = a.mean(dim=1)  # (B, H, T, T) -> (B, T, T)
            step = 0.5 * w + 0.5 * torch.eye(w.shape[-1], dtype=w.dtype)
            rollout = step if rollout is None else step @ rollout
        return rollout

    report = check_attention_rollout(half_and_half)
    assert report.passed, str(report)
