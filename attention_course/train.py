"""A small training loop with a progress bar, and sequence-level metrics."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm  # the plain bar: tqdm.auto needs ipywidgets in Jupyter

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
    device = next(model.parameters()).device
    src, tgt = src.to(device), tgt.to(device)
    gen = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98))
    warmup = max(1, num_steps // 10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / warmup))
    ignore = model.pad_id if model.pad_id is not None else -100
    model.train()

    def step(i: int) -> float:
        index = torch.randint(0, src.shape[0], (batch_size,), generator=gen).to(device)
        s, t = src[index], tgt[index]
        logits = model(s, t[:, :-1])  # (B, T, V): position t predicts token t + 1
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),  # (B, T, V) -> (B*T, V)
            t[:, 1:].reshape(-1),  # (B, T) -> (B*T,)
            ignore_index=ignore,
        )
        return optimization_step(model, loss, optimizer, scheduler, clip_norm)

    return fit(step, num_steps, progress=progress)


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
