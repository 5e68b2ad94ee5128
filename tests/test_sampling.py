"""filter_logits: top-k and top-p (nucleus) truncation, on hand-computed cases and
against a sorted-cumsum reference."""

from __future__ import annotations

import math

import pytest
import torch

from attention_course import filter_logits

INF = float("inf")
# probabilities 0.5, 0.25, 0.125, 0.125: their sums are exact in float32 and float64
DYADIC = [math.log(p) for p in (0.5, 0.25, 0.125, 0.125)]


def kept(logits: torch.Tensor) -> list:
    """Which entries survived, as nested lists of bools."""
    return torch.isfinite(logits).tolist()


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([1.0, 3.0, -2.0, 2.0, 0.0])
    out = filter_logits(logits, top_k=2)
    assert out.tolist() == [-INF, 3.0, -INF, 2.0, -INF]


def test_top_k_keeps_ties_at_the_kth_value():
    logits = torch.tensor([1.0, 2.0, 2.0, 3.0, 2.0])
    assert kept(filter_logits(logits, top_k=2)) == [False, True, True, True, True]
    assert kept(filter_logits(logits, top_k=1)) == [False, False, False, True, False]


@pytest.mark.parametrize("k", [4, 5, 100])
def test_top_k_at_least_vocabulary_keeps_everything(k):
    logits = torch.randn(3, 4)
    out = filter_logits(logits, top_k=k)
    assert torch.equal(out, logits) and out is not logits


def test_top_p_keeps_the_token_that_crosses():
    logits = torch.tensor(DYADIC)
    # 0.5 < 0.6: the second token crosses 0.6 and is kept
    assert kept(filter_logits(logits, top_p=0.6)) == [True, True, False, False]
    # 0.5 already reaches 0.5: one token
    assert kept(filter_logits(logits, top_p=0.5)) == [True, False, False, False]
    assert kept(filter_logits(logits, top_p=0.1)) == [True, False, False, False]


def test_top_p_a_token_exactly_reaching_ends_the_set():
    for dtype in (torch.float32, torch.float64):
        logits = torch.tensor(DYADIC, dtype=dtype)
        # 0.5 + 0.25 = 0.75 exactly: the third token is not needed
        assert kept(filter_logits(logits, top_p=0.75)) == [True, True, False, False]
        # just above 0.75: the last two (tied) tokens are both needed
        assert kept(filter_logits(logits, top_p=0.76)) == [True, True, True, True]


def test_top_p_keeps_ties_with_the_last_token_kept():
    logits = torch.log(torch.tensor([0.4, 0.2, 0.2, 0.2]))
    # 0.4 + 0.2 = 0.6 crosses 0.5 with one of three tied tokens: all three stay
    assert kept(filter_logits(logits, top_p=0.5)) == [True, True, True, True]
    assert kept(filter_logits(logits, top_p=0.4)) == [True, False, False, False]


def test_top_p_one_keeps_everything():
    logits = torch.tensor([0.0, -30.0, -200.0, 5.0])
    out = filter_logits(logits, top_p=1.0)
    assert torch.equal(out, logits)


def test_order_does_not_matter():
    perm = torch.tensor([2, 0, 3, 1])
    logits = torch.tensor(DYADIC)[perm]
    assert kept(filter_logits(logits, top_p=0.6)) == [False, True, False, True]


def test_both_filters_top_k_first_then_top_p_on_the_renormalised_rest():
    # probabilities 0.4, 0.3, 0.2, 0.1; top_k=3 renormalises to 4/9, 3/9, 2/9
    logits = torch.log(torch.tensor([0.1, 0.4, 0.2, 0.3]))
    # top_p=0.72 alone: 0.4 + 0.3 = 0.7 < 0.72, so three tokens are needed
    assert kept(filter_logits(logits, top_p=0.72)) == [False, True, True, True]
    # after top_k=3: 4/9 + 3/9 = 0.778 >= 0.72, two tokens
    assert kept(filter_logits(logits, top_k=3, top_p=0.72)) == [False, True, False, True]
    # top_k is not ignored when top_p keeps more
    assert kept(filter_logits(logits, top_k=1, top_p=0.99)) == [False, True, False, False]


def test_already_masked_tokens_stay_masked():
    logits = torch.tensor([-INF, 2.0, 1.0, -INF])
    assert kept(filter_logits(logits, top_p=0.99)) == [False, True, True, False]
    assert kept(filter_logits(logits, top_k=3)) == [False, True, True, False]


def test_a_row_of_minus_infinity_stays_minus_infinity():
    logits = torch.full((2, 3), -INF)
    out = filter_logits(logits, top_k=2, top_p=0.5)
    assert torch.equal(out, logits) and not out.isnan().any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_batch_shapes_and_dtypes(dtype):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 11, generator=generator).to(dtype)
    out = filter_logits(logits, top_k=5, top_p=0.8)
    assert out.shape == logits.shape and out.dtype == dtype
    for b in range(2):
        for t in range(3):
            row = filter_logits(logits[b, t], top_k=5, top_p=0.8)
            assert torch.equal(out[b, t], row)
    kept_counts = torch.isfinite(out).sum(-1)
    assert bool((kept_counts >= 1).all()) and bool((kept_counts <= 5).all())
    # kept entries are unchanged
    assert torch.equal(out[torch.isfinite(out)], logits[torch.isfinite(out)])


def test_input_is_not_modified():
    logits = torch.randn(4, 9)
    before = logits.clone()
    for kwargs in ({"top_k": 3}, {"top_p": 0.5}, {"top_k": 4, "top_p": 0.9}, {}):
        out = filter_logits(logits, **kwargs)
        assert torch.equal(logits, before)
        out.add_(1.0)  # the result is a new tensor, even when nothing was dropped
        assert torch.equal(logits, before)


def test_gradient_flows_to_kept_logits():
    logits = torch.randn(5, requires_grad=True)
    filter_logits(logits, top_k=2).softmax(-1)[0].backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"top_k": 0}, "top_k"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.0}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.2}, "top_p"),
        ({"top_p": float("nan")}, "top_p"),
        ({"top_p": "0.9"}, "top_p"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, name):
    with pytest.raises(ValueError, match=name):
        filter_logits(torch.randn(3, 5), **kwargs)


def test_bad_logits():
    with pytest.raises(ValueError, match="logits"):
        filter_logits(torch.tensor([1, 2, 3]), top_k=1)
    with pytest.raises(ValueError, match="logits"):
        filter_logits(torch.tensor(1.0), top_k=1)


# ---------------------------------------------------------------- property test


def reference_filter(logits: torch.Tensor, top_k, top_p) -> torch.Tensor:
    """One row at a time, in float64 with Python sums: the definition, spelled out."""
    out = logits.clone().double()
    for row in out.reshape(-1, out.shape[-1]):
        if top_k is not None and top_k < row.numel():
            kth = sorted(row.tolist(), reverse=True)[top_k - 1]
            row[row < kth] = -INF
        if top_p is not None and top_p < 1:
            probs = row.softmax(-1).tolist()
            order = sorted(range(len(probs)), key=lambda i: -probs[i])
            mass, last = 0.0, None
            for i in order:
                if mass >= top_p:
                    break
                mass, last = mass + probs[i], probs[i]
            for i, p in enumerate(probs):
                if p < last:
                    row[i] = -INF
    return out


@pytest.mark.parametrize("seed", range(40))
def test_matches_a_sorted_cumsum_reference(seed):
    generator = torch.Generator().manual_seed(seed)
    V = int(torch.randint(1, 30, (1,), generator=generator))
    scale = float(torch.rand((), generator=generator)) * 4 + 0.1
    logits = torch.randn(3, V, generator=generator, dtype=torch.float64) * scale
    top_k = [None, 1, 3, 10, 40][seed % 5]
    top_p = [None, 0.3, 0.9, 0.95, 1.0, 0.05, 0.5, 0.75][seed % 8]
    got = filter_logits(logits, top_k=top_k, top_p=top_p)
    expected = reference_filter(logits, top_k, top_p)
    assert kept(got) == kept(expected), (top_k, top_p)
    assert torch.equal(got[torch.isfinite(got)], logits[torch.isfinite(got)])
