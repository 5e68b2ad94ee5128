"""Data parallelism (chapter 23): the chapter-13 GPT under DistributedDataParallel on 2
processes (gloo over the loopback interface) gives every rank the gradients one process
computes on the whole batch."""

from __future__ import annotations

import pytest
import torch

from attention_course import ddp_gradients_worker, run_ring, single_process_gradients

CONFIG = dict(vocab_size=17, d_model=16, num_heads=2, num_layers=2, max_len=12)


def _batch(B: int, T: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, CONFIG["vocab_size"], (B, T + 1), generator=gen)
    return ids[:, :-1], ids[:, 1:]  # inputs and next-token targets, (B, T) each


@pytest.fixture(scope="module")
def ddp_results():
    ids, targets = _batch(4)
    return run_ring(ddp_gradients_worker, 2, CONFIG, ids, targets, 7, timeout=120.0)


@pytest.mark.slow
def test_ddp_gradients_equal_one_process_on_the_whole_batch(ddp_results):
    ids, targets = _batch(4)
    want, loss = single_process_gradients(CONFIG, ids, targets, 7)
    for rank, (grads, _) in enumerate(ddp_results):
        assert grads.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(
                grads[name],
                want[name],
                rtol=1e-10,
                atol=1e-12,
                msg=lambda m, n=name, r=rank: f"rank {r}, {n}: {m}",
            )
    # the whole batch's mean loss is the mean of the two halves' mean losses
    assert abs(loss - (ddp_results[0][1] + ddp_results[1][1]) / 2) < 1e-12
    # and the halves differ: each rank saw other rows
    assert abs(ddp_results[0][1] - ddp_results[1][1]) > 1e-6


@pytest.mark.slow
def test_without_ddp_the_ranks_gradients_differ(ddp_results):
    """What DDP did: each half on its own gives other gradients (so the test above cannot
    pass by accident), and their mean is the whole batch's."""
    ids, targets = _batch(4)
    first, _ = single_process_gradients(CONFIG, ids[:2], targets[:2], 7)
    second, _ = single_process_gradients(CONFIG, ids[2:], targets[2:], 7)
    name = "blocks.0.attn.w_q.weight" if "blocks.0.attn.w_q.weight" in first else next(iter(first))
    assert not torch.allclose(first[name], second[name])
    for name in first:
        torch.testing.assert_close((first[name] + second[name]) / 2, ddp_results[0][0][name])


@pytest.mark.slow
def test_uneven_batch_is_refused():
    """A batch that W does not divide: unequal shares would weight the examples unequally."""
    with pytest.raises(RuntimeError, match="rank [01] of 2 failed(.|\\n)*ids: got a batch of B=3"):
        run_ring(ddp_gradients_worker, 2, CONFIG, *_batch(3), 7, timeout=60.0)
