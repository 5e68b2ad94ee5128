"""A small training loop with a progress bar, and sequence-level metrics."""

from __future__ import annotations

import math
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
    # Redraw at most every 2 s (tqdm's default is 0.1 s): a notebook keeps every redraw as
    # an output of its own, and the built site prints each one as a line.
    bar = tqdm(range(num_steps), desc=desc, disable=not progress, leave=False, mininterval=2.0)
    for i in bar:
        loss = float(step(i))
        losses.append(loss)
        if i % 10 == 0 or i == num_steps - 1:
            bar.set_postfix(loss=f"{loss:.4f}", refresh=False)  # shown at the next redraw
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


def lm_batch(
    ids: torch.Tensor, batch_size: int, context: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A random batch of windows of a 1-D token sequence and their next-token targets.

    Window ``b`` starts at a random offset ``i`` (drawn with ``generator``): inputs
    ``ids[i : i + context]``, targets ``ids[i + 1 : i + context + 1]`` (the inputs shifted
    by one: position t predicts token t + 1).

    Shapes: ids ``(N,)``; returns two ``(batch_size, context)`` LongTensors on ids' device.
    """
    starts = torch.randint(0, ids.numel() - context, (batch_size,), generator=generator)
    index = starts[:, None] + torch.arange(context + 1)  # (B, context + 1)
    window = ids[index.to(ids.device)]
    return window[:, :-1], window[:, 1:]


def _check_lm_ids(name: str, ids: object, context: int) -> torch.Tensor:
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.is_floating_point():
        got = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"{name}: got {got}, expected a 1-D tensor of token ids")
    if ids.numel() < context + 1:
        raise ValueError(
            f"{name}: got {ids.numel()} tokens, expected at least context + 1 = {context + 1}"
        )
    return ids.long()


def _cosine_factor(i: int, warmup: int, total: int, floor: float) -> float:
    """Linear warm-up to 1 over ``warmup`` steps, then a cosine decay to ``floor`` at ``total``."""
    if i < warmup:
        return (i + 1) / warmup
    progress = min(1.0, (i - warmup) / max(1, total - warmup))
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def train_language_model(
    model: nn.Module,
    train_ids: torch.Tensor,
    val_ids: torch.Tensor | None = None,
    *,
    steps: int,
    batch_size: int = 32,
    context: int = 64,
    lr: float = 3e-3,
    weight_decay: float = 0.1,
    warmup: int | None = None,
    min_lr_ratio: float = 0.1,
    clip_norm: float | None = 1.0,
    eval_every: int | None = None,
    eval_tokens: int | None = 32768,
    seed: int = 0,
    progress: bool = True,
    time_limit: float | None = None,
) -> dict:
    """Train a next-token model ``model(ids (B, T)) -> logits (B, T, V)`` on one long text.

    Each step draws ``batch_size`` random windows of ``context`` tokens from ``train_ids``
    (:func:`lm_batch`, with a ``torch.Generator`` seeded by ``seed``: the same batches on
    every run), computes the cross-entropy of the shifted targets, and takes an AdamW step
    (betas 0.9, 0.95; ``weight_decay`` on matrices and embeddings only, not on biases and
    norm gains, as GPT-2 / nanoGPT) after clipping the gradient norm to ``clip_norm``. The
    learning rate warms up linearly over ``warmup`` steps (default: 5 % of ``steps``), then
    decays along a cosine to ``min_lr_ratio * lr``. A tqdm bar shows the loss
    (``progress=False`` hides it).

    Every ``eval_every`` steps (default: 10 evaluations in all) and at the end, the
    held-out loss :func:`evaluate_lm` on the first ``eval_tokens`` tokens of ``val_ids``
    (None: all of them) is recorded. ``time_limit`` (seconds) stops early, after the step
    that crosses it (for a live demonstration; a time limit makes the run depend on the
    machine's speed). The model is left in evaluation mode.

    Returns:
        a dict: ``"train_loss"`` (one float per step, nats/token), ``"val_step"`` and
        ``"val_loss"`` (the steps evaluated and their held-out losses), ``"steps"``
        (steps taken), ``"seconds"`` (wall time), ``"tokens"`` (tokens trained on).
    """
    import time

    check_positive = (("steps", steps), ("batch_size", batch_size), ("context", context))
    for name, value in check_positive:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}: got {value!r}, expected a positive int")
    train_ids = _check_lm_ids("train_ids", train_ids, context)
    if val_ids is not None:
        val_ids = _check_lm_ids("val_ids", val_ids, context)
        if eval_tokens is not None:
            val_ids = val_ids[: max(eval_tokens, context + 1)]
    device = next(model.parameters()).device
    train_ids = train_ids.to(device)
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0}],
        lr=lr,
        betas=(0.9, 0.95),
    )
    warmup = max(1, steps // 20) if warmup is None else max(1, warmup)
    factor = partial(_cosine_factor, warmup=warmup, total=steps, floor=min_lr_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    eval_every = max(1, steps // 10) if eval_every is None else eval_every
    gen = torch.Generator().manual_seed(seed)
    history = {"train_loss": [], "val_step": [], "val_loss": [], "steps": 0, "tokens": 0}

    def evaluate(step: int) -> None:
        if val_ids is not None:
            history["val_step"].append(step)
            history["val_loss"].append(evaluate_lm(model, val_ids, context, batch_size=64))

    start = time.perf_counter()
    # Redraw at most every 5 s (tqdm's default is 0.1 s): a notebook keeps every redraw as
    # an output of its own, and the built site prints each one as a line.
    bar = tqdm(range(steps), desc="training", disable=not progress, leave=False, mininterval=5.0)
    for i in bar:
        model.train()
        x, y = lm_batch(train_ids, batch_size, context, gen)
        logits = model(x)  # (B, T, V)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        value = optimization_step(model, loss, optimizer, scheduler, clip_norm)
        history["train_loss"].append(value)
        history["steps"] = i + 1
        history["tokens"] += batch_size * context
        if i % 10 == 0:
            bar.set_postfix(loss=f"{value:.3f}", refresh=False)  # shown at the next redraw
        out_of_time = time_limit is not None and time.perf_counter() - start > time_limit
        if (i + 1) % eval_every == 0 and i + 1 < steps and not out_of_time:
            evaluate(i + 1)
        if out_of_time:
            break
    bar.close()
    evaluate(history["steps"])
    model.eval()
    history["seconds"] = time.perf_counter() - start
    return history


@torch.no_grad()
def evaluate_lm(
    model: nn.Module, ids: torch.Tensor, context: int = 64, batch_size: int = 64
) -> float:
    """Mean cross-entropy in nats per token of ``model`` on ``ids``, deterministic.

    The text is cut into **non-overlapping** windows of ``context`` tokens; window ``w``
    reads ``ids[w * context : (w + 1) * context]`` and predicts the next token at every
    position, so every token after the first is predicted exactly once, the one at
    window offset ``j`` from ``j`` tokens of context (0 to ``context - 1``; on average
    about ``context / 2``: a model scores a little better with a sliding window, which
    costs ``context`` times more). The last, shorter window is included. Runs in
    evaluation mode (restored afterwards). Divide by ``ln 2`` for bits per token.

    Shapes: ids ``(N,)`` with ``N >= 2``; returns a float.
    """
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.numel() < 2:
        got = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"ids: got {got}, expected a 1-D tensor of at least 2 token ids")
    if not isinstance(context, int) or isinstance(context, bool) or context < 1:
        raise ValueError(f"context: got {context!r}, expected a positive int")
    device = next(model.parameters()).device
    ids = ids.long().to(device)
    n_full = (ids.numel() - 1) // context  # windows with all their targets inside ids
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        if n_full:
            x = ids[: n_full * context].view(n_full, context)
            y = ids[1 : n_full * context + 1].view(n_full, context)
            for i in range(0, n_full, batch_size):
                logits = model(x[i : i + batch_size])  # (b, context, V)
                loss = F.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]).double(),
                    y[i : i + batch_size].reshape(-1),
                    reduction="sum",
                )
                total, count = total + float(loss), count + y[i : i + batch_size].numel()
        rest = ids[n_full * context :]
        if rest.numel() >= 2:
            logits = model(rest[None, :-1])  # (1, r, V)
            loss = F.cross_entropy(logits[0].double(), rest[1:], reduction="sum")
            total, count = total + float(loss), count + rest.numel() - 1
    finally:
        model.train(was_training)
    return total / count
