"""Tests for the chapter-3 unshuffle task and PairAligner."""

import pytest
import torch

from attention_course.alignment import PairAligner, unshuffle_losses
from attention_course.data.unshuffle import PAD, make_unshuffle_task

TEST_LENGTHS, TEST_OFFSETS = (7, 12), (5, 15)
TRAIN_LENGTHS = [n for n in range(5, 16) if n not in TEST_LENGTHS]
TRAIN_OFFSETS = [o for o in range(1, 21) if o not in TEST_OFFSETS]


def test_lengths_offsets_and_padding_are_as_asked():
    task = make_unshuffle_task(300, (5, 9, 20), (3, 30), seed=0, max_step=2)
    assert set(task.lengths.tolist()) == {5, 9, 20}
    assert set(task.offsets.tolist()) == {3, 30}
    assert task.pairs.shape == (300, 20, 2) and task.order.shape == (300, 20)
    assert task.num_values == 30 + 2 * 21 + 1
    mask = task.mask
    torch.testing.assert_close(mask.sum(-1), task.lengths)
    assert (task.pairs[~mask] == PAD).all() and (task.previous[~mask] == PAD).all()
    assert (task.pairs[mask] > PAD).all() and int(task.pairs.max()) < task.num_values


def test_targets_form_the_chain_and_order_undoes_the_shuffle():
    task = make_unshuffle_task(200, range(5, 21), range(1, 31), seed=3, max_step=3)
    for b in range(len(task)):
        n, o = int(task.lengths[b]), int(task.offsets[b])
        order, target, prev = task.order[b, :n], task.targets[b, :n], task.previous[b, :n]
        assert sorted(order.tolist()) == list(range(n))  # a permutation of the inputs
        torch.testing.assert_close(task.pairs[b, :n][order], target)
        assert int(prev[0, 0]) == o  # the start link begins at the offset
        torch.testing.assert_close(prev[1:], target[:-1])  # teacher forcing: the true previous
        torch.testing.assert_close(target[:, 0], prev[:, 1])  # starts where the last ended
        steps = target[:, 1] - target[:, 0]
        assert int(steps.min()) >= 1 and int(steps.max()) <= 3
    # max_step=1 gives the consecutive chain [o+1, o+2], ..., [o+n, o+n+1]
    fixed = make_unshuffle_task(5, 6, 4, max_step=1)
    first = torch.arange(5, 11)
    torch.testing.assert_close(fixed.targets[0], torch.stack([first, first + 1], -1))


def test_held_out_split_is_disjoint_from_training():
    train = make_unshuffle_task(1000, TRAIN_LENGTHS, TRAIN_OFFSETS, seed=0, num_values=60)
    test = make_unshuffle_task(300, TEST_LENGTHS, TEST_OFFSETS, seed=1, num_values=60)
    assert not set(train.lengths.tolist()) & set(test.lengths.tolist())
    assert not set(train.offsets.tolist()) & set(test.offsets.tolist())
    seen = {frozenset(map(tuple, p.tolist())) for p in train.pairs}
    assert not any(frozenset(map(tuple, p.tolist())) in seen for p in test.pairs)
    # ...and the test set is not one chain reshuffled: its examples differ
    assert len({str(t.tolist()) for t in test.targets}) > 250


def test_deterministic_and_leaves_global_rng_alone():
    state = torch.get_rng_state()
    a = make_unshuffle_task(20, seed=7)
    assert torch.equal(torch.get_rng_state(), state)
    b = make_unshuffle_task(20, seed=7)
    assert torch.equal(a.pairs, b.pairs) and torch.equal(a.order, b.order)
    assert not torch.equal(a.pairs, make_unshuffle_task(20, seed=8).pairs)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"num_samples": 0}, "num_samples"),
        ({"lengths": 1}, "lengths"),
        ({"lengths": []}, "lengths"),
        ({"offsets": 0}, "offsets"),
        ({"offsets": (2.5,)}, "offsets"),
        ({"max_step": 0}, "max_step"),
        ({"num_values": 10}, "num_values"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs, name):
    args = {"num_samples": 4, **kwargs}
    with pytest.raises(ValueError, match=name):
        make_unshuffle_task(**args)


def _model(num_values=60, seed=0):
    torch.manual_seed(seed)
    return PairAligner(num_values, d_model=16, hidden_dim=16)


def test_pair_aligner_shapes_masking_and_permutation_equivariance():
    task = make_unshuffle_task(6, (4, 6), seed=0, num_values=60)
    model = _model()
    context, w = model(task.pairs, task.previous, task.mask)
    assert context.shape == (6, 6, 16) and w.shape == (6, 6, 6)
    torch.testing.assert_close(w.sum(-1), torch.ones(6, 6))
    assert (w.transpose(1, 2)[~task.mask] == 0).all()  # no weight on a padded input
    # permute the inputs (and the mask): the weights permute, the context does not change
    perm = torch.tensor([4, 2, 0, 5, 1, 3])
    context_p, w_p = model(task.pairs[:, perm], task.previous, task.mask[:, perm])
    torch.testing.assert_close(w_p, w[:, :, perm])
    torch.testing.assert_close(context_p, context)
    assert model.read(context).shape == (6, 6, 2, 60)
    chosen, outputs, rows = model.unshuffle(task.pairs, task.previous[:, 0], task.mask)
    assert chosen.shape == (6, 6) and outputs.shape == (6, 6, 2) and rows.shape == (6, 6, 6)


def test_reshufflings_of_one_chain_have_exactly_the_same_loss():
    """Why the old task was vacuous: equivariance makes every reshuffling one example."""
    fixed = make_unshuffle_task(50, 8, 1, seed=0, num_values=60, max_step=1)
    model = _model()
    losses = [
        sum(unshuffle_losses(model, *(t[b : b + 1] for t in _batch(fixed)))).item()
        for b in range(len(fixed))
    ]
    assert max(losses) - min(losses) < 1e-5
    varied = make_unshuffle_task(50, 8, range(1, 20), seed=0, num_values=60)
    losses = [
        sum(unshuffle_losses(model, *(t[b : b + 1] for t in _batch(varied)))).item()
        for b in range(len(varied))
    ]
    assert max(losses) - min(losses) > 1e-2


def _batch(task):
    return task.pairs, task.previous, task.order, task.mask


def test_losses_ignore_the_padding():
    task = make_unshuffle_task(8, (5, 9), seed=1, num_values=60)
    model = _model()
    pointer, readout = unshuffle_losses(model, *_batch(task))
    longer = [torch.nn.functional.pad(t, (0, 0, 0, 3)) for t in (task.pairs, task.previous)]
    order = torch.nn.functional.pad(task.order, (0, 3))
    mask = torch.nn.functional.pad(task.mask, (0, 3))
    pointer2, readout2 = unshuffle_losses(model, *longer, order, mask)
    torch.testing.assert_close(pointer2, pointer)
    torch.testing.assert_close(readout2, readout)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda m, t: m(t.pairs.float(), t.previous), "pairs"),
        (lambda m, t: m(t.pairs[..., :1], t.previous), "pairs"),
        (lambda m, t: m(t.pairs, t.previous[:2]), "previous"),
        (lambda m, t: m(t.pairs, t.previous + 100), "previous"),
        (lambda m, t: m(t.pairs, t.previous, t.mask.long()), "mask"),
        (lambda m, t: m.unshuffle(t.pairs, t.previous[:, :1], t.mask), "start"),
        (lambda m, t: unshuffle_losses(m, t.pairs, t.previous, t.order[:, :2], t.mask), "order"),
    ],
)
def test_pair_aligner_bad_input_raises_value_error(call, name):
    task = make_unshuffle_task(4, 6, seed=0, num_values=60)
    with pytest.raises(ValueError, match=name):
        call(_model(), task)
    with pytest.raises(ValueError, match="num_values"):
        PairAligner(0)


def test_trained_model_beats_the_random_baseline_on_held_out_lengths_and_offsets():
    torch.manual_seed(0)
    train = make_unshuffle_task(1000, TRAIN_LENGTHS, TRAIN_OFFSETS, seed=0, num_values=60)
    test = make_unshuffle_task(200, TEST_LENGTHS, TEST_OFFSETS, seed=1, num_values=60)
    model = PairAligner(60, d_model=32, hidden_dim=32)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(150):
        index = torch.randint(0, len(train), (64,), generator=gen)
        batch = (t[index] for t in _batch(train))
        pointer, readout = unshuffle_losses(model, *batch)
        optimizer.zero_grad()
        (pointer + readout).backward()
        optimizer.step()
    chosen, outputs, _ = model.unshuffle(test.pairs, test.previous[:, 0], test.mask)
    real = test.mask
    pointer_accuracy = (chosen == test.order)[real].float().mean().item()
    step_accuracy = (outputs == test.targets).all(-1)[real].float().mean().item()
    baseline = (1 / test.lengths.float()).mean().item()
    print(
        f"held-out pointer accuracy {pointer_accuracy:.3f}, output accuracy {step_accuracy:.3f}, "
        f"random baseline {baseline:.3f}, margin {pointer_accuracy - baseline:.3f}"
    )
    assert pointer_accuracy - baseline > 0.5
    assert step_accuracy - baseline > 0.5
