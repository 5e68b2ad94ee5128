"""A small training loop with a progress bar, and sequence-level metrics."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm  # the plain bar: tqdm.auto needs ipywidgets in Jupyter

from ._validate import shape_str
from .transformer import Transformer, greedy_decode


def fit(
    step: Callable[[int], float], num_steps: int, progress: bool = True, desc: str = "training"
) -> list[float]:
    """Call ``step(i)`` for ``i = 0 .. num_steps - 1``; return the losses it reports.

    ``step`` does one optimisation step and returns the loss as a float. A tqdm
    bar shows progress and the latest loss (``progress=False`` hides it).
    """
    losses = []
    bar = tqdm(range(num_steps), desc=desc, disable=not progress, leave=False)
    for i in bar:
        loss = float(step(i))
        losses.append(loss)
        if i % 10 == 0 or i == num_steps - 1:
            bar.set_postfix(loss=f"{loss:.4f}")
    return losses


def optimization_step(
    model: torch.nn.Module,
    loss: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    clip_norm: float | None,
) -> float:
    """Backpropagate ``loss``, clip the gradient norm, step the optimizer and the
    learning-rate schedule; return the loss as a float."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if clip_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    scheduler.step()
    return loss.item()


def _warmup_then_decay(i: int, warmup: int, total: int | None) -> float:
    """Learning-rate factor: linear warm-up to 1 over ``warmup`` steps, then constant
    (``total=None``) or a linear decay to 0 at step ``total``."""
    if i < warmup:
        return (i + 1) / warmup
    if total is None:
        return 1.0
    return max(0.0, (total - i) / max(1, total - warmup))


def make_optimizer(model: nn.Module, lr: float, num_steps: int, decay: bool):
    """Adam (betas 0.9, 0.98, as the paper) with a linear warm-up over the first 10% of
    ``num_steps``, then a constant rate or (``decay=True``) a linear decay to zero.

    Returns ``(optimizer, scheduler)``; step the scheduler once per optimisation step.
    """
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98))
    warmup = max(1, num_steps // 10)
    factor = partial(_warmup_then_decay, warmup=warmup, total=num_steps if decay else None)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def train_seq2seq(
    model: Transformer,
    src: torch.Tensor,
    tgt: torch.Tensor,
    *,
    num_steps: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    progress: bool = True,
    clip_norm: float | None = 1.0,
) -> list[float]:
    """Train with teacher forcing and cross-entropy on the next token.

    The decoder reads ``tgt[:, :-1]`` (BOS and the answer so far) and predicts
    ``tgt[:, 1:]``; padded labels (``model.pad_id``) are ignored in the loss.
    Batches are drawn with a private generator seeded by ``seed``. Uses Adam
    with a linear warm-up over the first 10% of steps.

    Shapes:
        src: ``(N, S)``; tgt: ``(N, T + 1)``; returns ``num_steps`` losses.
    """
    ignore = model.pad_id if model.pad_id is not None else -100

    def loss_of(s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logits = model(s, t[:, :-1])  # (B, T, V): position t predicts token t + 1
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),  # (B, T, V) -> (B*T, V)
            t[:, 1:].reshape(-1),  # (B, T) -> (B*T,)
            ignore_index=ignore,
        )

    settings = (num_steps, batch_size, lr, seed, progress, clip_norm)
    return _train(model, (src, tgt), loss_of, *settings, decay=False)


def _train(model, data, loss_of, num_steps, batch_size, lr, seed, progress, clip_norm, *, decay):
    """Minimise ``loss_of(*batch)`` over random batches of the rows of the ``data`` tensors.

    Batches are drawn with a private generator seeded by ``seed``; the optimizer and
    schedule come from :func:`make_optimizer`. Returns the ``num_steps`` losses.
    """
    device = next(model.parameters()).device
    data = [x.to(device) for x in data]
    gen = torch.Generator().manual_seed(seed)
    optimizer, scheduler = make_optimizer(model, lr, num_steps, decay=decay)
    model.train()

    def step(i: int) -> float:
        index = torch.randint(0, data[0].shape[0], (batch_size,), generator=gen).to(device)
        loss = loss_of(*(x[index] for x in data))
        return optimization_step(model, loss, optimizer, scheduler, clip_norm)

    return fit(step, num_steps, progress=progress)


def train_classifier(
    model: nn.Module,
    tokens: torch.Tensor,
    labels: torch.Tensor,
    *,
    num_steps: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    progress: bool = True,
    clip_norm: float | None = 1.0,
) -> list[float]:
    """Train any ``model(tokens) -> logits (B, C)`` with cross-entropy on ``labels``.

    Batches are drawn with a private generator seeded by ``seed``. Uses Adam
    with a linear warm-up over the first 10% of steps (as ``train_seq2seq``),
    then a linear decay of the learning rate to zero: small steps at the end
    settle the weights, which matters for held-out accuracy.

    Shapes:
        tokens: ``(N, T)``; labels: ``(N,)`` class ids; returns ``num_steps`` losses.
    """
    if tokens.shape[0] != labels.shape[0] or labels.dim() != 1:
        raise ValueError(
            f"labels: got shape {shape_str(labels.shape)}, expected ({tokens.shape[0]},), "
            f"one class id per row of tokens {shape_str(tokens.shape)}"
        )

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x), y)  # (B, C), (B,) -> ()

    settings = (num_steps, batch_size, lr, seed, progress, clip_norm)
    return _train(model, (tokens, labels), loss_of, *settings, decay=True)


@torch.no_grad()
def accuracy(
    model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor, batch_size: int = 512
) -> float:
    """Fraction of rows whose highest logit is the label (evaluation mode, restored after).

    Shapes:
        tokens: ``(N, T)``; labels: ``(N,)``; returns a float in [0, 1].
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    correct = 0
    try:
        for i in range(0, tokens.shape[0], batch_size):
            logits = model(tokens[i : i + batch_size].to(device))  # (B, C)
            correct += int((logits.argmax(dim=-1) == labels[i : i + batch_size].to(device)).sum())
    finally:
        model.train(was_training)
    return correct / tokens.shape[0]


def exact_match(
    model: Transformer,
    src: torch.Tensor,
    tgt: torch.Tensor,
    bos_id: int,
    eos_id: int,
    batch_size: int = 256,
) -> float:
    """Fraction of sequences that :func:`greedy_decode` reproduces exactly, up to EOS.

    Shapes:
        src: ``(N, S)``; tgt: ``(N, T)`` starting with BOS; returns a float in [0, 1].
    """
    device = next(model.parameters()).device
    correct = 0
    for i in range(0, src.shape[0], batch_size):
        s = src[i : i + batch_size].to(device)
        t = tgt[i : i + batch_size].to(device)
        pred = greedy_decode(model, s, max_len=t.shape[1], bos_id=bos_id, eos_id=eos_id)
        for p, y in zip(pred.tolist(), t.tolist()):
            correct += _until_eos(p, eos_id) == _until_eos(y, eos_id)
    return correct / src.shape[0]


def _until_eos(tokens: list[int], eos_id: int) -> list[int]:
    return tokens[: tokens.index(eos_id) + 1] if eos_id in tokens else tokens
