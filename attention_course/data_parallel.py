"""Data parallelism (chapter 23): one model copy per process, the batch split between them.

Each of ``W`` processes holds the whole model and computes the gradients of its share of
the batch; ``torch.nn.parallel.DistributedDataParallel`` (DDP) then averages the
gradients over the processes with an all-reduce during the backward pass, so that every
copy takes the same optimiser step. With equal shares and a loss that is a mean over the
examples, the average of the per-process gradients is the gradient of the whole batch:
:func:`ddp_gradients_worker` on ``W`` processes returns what
:func:`single_process_gradients` returns on one.

PyTorch's DDP documentation: ``torch.nn.parallel.DistributedDataParallel``; the workers
here are started with :func:`attention_course.ring.run_ring` (``torchrun`` on real
machines).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from .gpt import GPT


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of a language model over every position of the batch.

    Shapes: logits ``(B, T, V)``; targets ``(B, T)`` token ids; returns a scalar.
    """
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # (B*T, V), (B*T,)


def ddp_gradients_worker(config: dict, ids: torch.Tensor, targets: torch.Tensor, seed: int):
    """A worker for :func:`~attention_course.ring.run_ring`: data parallelism for one step.

    Rank ``r`` of ``W`` builds ``GPT(**config)`` in float64 with the seed ``seed + r`` (so
    the copies start *different*, on purpose), wraps it in ``DistributedDataParallel``
    (whose constructor broadcasts rank 0's parameters and buffers to every rank), takes rows
    ``r*B/W .. (r+1)*B/W - 1`` of the batch, and runs one forward and backward; DDP
    all-reduces the gradients (their mean over the ranks) during the backward.

    Returns ``(grads, loss)``: this rank's gradients by parameter name, after the
    all-reduce, and its loss on its share. Every rank's gradients equal
    :func:`single_process_gradients` ``(config, ids, targets, seed)`` on one process.

    Shapes: ids, targets ``(B, T)`` with ``B`` divisible by the world size.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    B = ids.shape[0]
    if B % world:
        raise ValueError(
            f"ids: got a batch of B={B}, expected a multiple of W={world} ranks "
            f"(equal shares: the mean of the shares' mean losses is the batch's mean)"
        )
    torch.manual_seed(seed + rank)  # different weights on each rank before DDP
    model = GPT(**config).double()
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's weights to every rank
    rows = slice(rank * B // world, (rank + 1) * B // world)
    loss = next_token_loss(ddp(ids[rows]), targets[rows])
    loss.backward()  # the gradients are all-reduced (averaged) here, bucket by bucket
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    return grads, loss.detach().item()


def single_process_gradients(config: dict, ids: torch.Tensor, targets: torch.Tensor, seed: int):
    """What :func:`ddp_gradients_worker` computes, on one process: ``GPT(**config)`` in
    float64 built with ``seed`` (rank 0's weights), the gradients of the whole batch's
    mean loss. Returns ``(grads, loss)``."""
    torch.manual_seed(seed)
    model = GPT(**config).double()
    loss = next_token_loss(model(ids), targets)
    loss.backward()
    return {
        name: p.grad.detach().clone() for name, p in model.named_parameters()
    }, loss.detach().item()
