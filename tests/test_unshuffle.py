"""Tests for the chapter-3 unshuffle task and PairAligner."""

import pytest
import torch

from attention_course.alignment import PairAligner
from attention_course.data.unshuffle import chain, make_unshuffle_task


def test_order_undoes_the_shuffle():
    task = make_unshuffle_task(50, 6, seed=3)
    for b in range(len(task)):
        assert torch.equal(task.pairs[b][task.order[b]], chain(6))
    # previous[i] is the pair before step i's target: the start token, then the chain
    assert task.previous[0, 0].tolist() == [0, 1]
    assert torch.equal(task.previous[0, 1:], chain(6)[:-1])
    assert task.num_values == 8


def test_exclude_gives_unseen_orders_and_is_deterministic():
    train = make_unshuffle_task(200, 5, seed=0)
    test = make_unshuffle_task(50, 5, seed=1, exclude=train)
    seen = {tuple(o) for o in train.order.tolist()}
    assert not any(tuple(o) in seen for o in test.order.tolist())
    assert torch.equal(
        make_unshuffle_task(20, 5, seed=7).pairs, make_unshuffle_task(20, 5, seed=7).pairs
    )


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="num_pairs"):
        make_unshuffle_task(10, 1)
    with pytest.raises(ValueError, match="num_samples"):
        make_unshuffle_task(0, 4)


def test_pair_aligner_shapes_and_permutation_equivariance():
    torch.manual_seed(0)
    task = make_unshuffle_task(4, 5, seed=0)
    model = PairAligner(task.num_values, d_model=8, hidden_dim=8)
    w = model(task.pairs, task.previous)
    assert w.shape == (4, 5, 5)
    torch.testing.assert_close(w.sum(-1), torch.ones(4, 5))
    perm = torch.tensor([4, 2, 0, 1, 3])
    torch.testing.assert_close(model(task.pairs[:, perm], task.previous), w[:, :, perm])
    chosen, rows = model.unshuffle(task.pairs)
    assert chosen.shape == (4, 5) and rows.shape == (4, 5, 5)
