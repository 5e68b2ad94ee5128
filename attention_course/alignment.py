"""A tiny encoder/decoder that aligns with additive attention (chapter 3).

The model solves the unshuffle task (:mod:`attention_course.data.unshuffle`):
the encoder turns every input pair into an annotation ``h_j``; the decoder
turns the previous output pair ``y_{i-1}`` into a state ``s_{i-1}``; Bahdanau's
alignment model (:class:`attention_course.AdditiveAttention`) scores every
``h_j`` against ``s_{i-1}``, and the context ``c_i = sum_j alpha_ij h_j`` is
read out into the output pair ``y_i``. The read-out sees ``c_i`` alone; the output
layer of Bahdanau, Cho & Bengio (2015) also sees ``s_i`` and ``y_{i-1}``.

:func:`unshuffle_losses` returns two losses. Trained on their sum, as chapter 3's
first run is, the alignment is supervised: the pointer loss trains the weights to
point at the input to copy next (a "pointer", Vinyals et al. 2015). Trained on the
read-out loss alone, as in chapter 3's second run, the alignment is learned only
because it helps the read-out.

Unlike Bahdanau's recurrent decoder, ``s_i = f(s_{i-1}, y_{i-1}, c_i)``, this
decoder state depends on ``y_{i-1}`` alone, so under teacher forcing every
step can be computed at once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._validate import check_positive_int, require_ndim, require_tensor, shape_str
from .attention import AdditiveAttention


def _require_pairs(name: str, x: object, layout: str) -> torch.Tensor:
    x = require_tensor(name, x)
    require_ndim(name, x, (3,), layout)
    if x.shape[-1] != 2 or x.is_floating_point() or x.dtype == torch.bool:
        raise ValueError(
            f"{name}: got shape {shape_str(x.shape)} dtype {x.dtype}, expected {layout} "
            f"integer values"
        )
    return x


class PairAligner(nn.Module):
    """Encoder, decoder state, additive attention and a read-out over pairs of integers.

    * annotation ``h_j = tanh(enc([emb(a_j); emb(b_j)]))`` for input pair ``[a_j, b_j]``;
    * decoder state ``s_{i-1} = tanh(dec([emb(y); emb(y')]))`` from the previous
      output pair ``y_{i-1} = [y, y']`` (no recurrence: the task needs no other memory);
    * ``alpha_ij = softmax_j(v^T tanh(W s_{i-1} + U h_j))`` and ``c_i = sum_j alpha_ij h_j``;
    * :meth:`read` turns ``c_i`` into logits for the two numbers of ``y_i``.

    Nothing here knows the input positions: the alignment is found by content,
    and permuting the input pairs permutes the weights the same way.

    Shapes:
        pairs: ``(B, S, 2)`` long; previous: ``(B, T, 2)`` long; mask: ``(B, S)``
        bool, True at real input pairs; returns context ``(B, T, D)`` and
        weights ``(B, T, S)`` (row ``i``: the alignment of step ``i``).
    """

    def __init__(self, num_values: int, d_model: int = 32, hidden_dim: int = 32) -> None:
        super().__init__()
        check_positive_int("num_values", num_values)
        check_positive_int("d_model", d_model)
        check_positive_int("hidden_dim", hidden_dim)
        self.num_values = num_values
        self.embed = nn.Embedding(num_values, d_model)
        self.encoder = nn.Linear(2 * d_model, d_model)  # a pair -> annotation h_j
        self.decoder = nn.Linear(2 * d_model, d_model)  # previous pair -> state s_{i-1}
        self.attention = AdditiveAttention(d_model, d_model, hidden_dim)
        self.readout = nn.Linear(d_model, 2 * num_values)  # c_i -> logits of y_i's two numbers

    def _embed_pairs(self, pairs: torch.Tensor) -> torch.Tensor:
        x = self.embed(pairs)  # (B, L, 2) -> (B, L, 2, D)
        return x.flatten(-2)  # (B, L, 2, D) -> (B, L, 2D): both numbers side by side

    def forward(
        self, pairs: torch.Tensor, previous: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _require_pairs("pairs", pairs, "(B, S, 2)")
        _require_pairs("previous", previous, "(B, T, 2)")
        if previous.shape[0] != pairs.shape[0]:
            raise ValueError(
                f"previous: got shape {shape_str(previous.shape)}, expected batch size "
                f"{pairs.shape[0]} to match pairs {shape_str(pairs.shape)}"
            )
        for name, x in (("pairs", pairs), ("previous", previous)):
            if x.numel() and (int(x.min()) < 0 or int(x.max()) >= self.num_values):
                raise ValueError(
                    f"{name}: got values in [{int(x.min())}, {int(x.max())}], expected "
                    f"values in [0, {self.num_values - 1}] (num_values={self.num_values})"
                )
        if mask is not None:
            mask = require_tensor("mask", mask)
            if mask.dtype != torch.bool or tuple(mask.shape) != tuple(pairs.shape[:2]):
                raise ValueError(
                    f"mask: got {mask.dtype} {shape_str(mask.shape)}, expected torch.bool "
                    f"{shape_str(pairs.shape[:2])} (B, S), True at real input pairs"
                )
            mask = mask[:, None, :]  # (B, S) -> (B, 1, S): the same keys for every step
        h = torch.tanh(self.encoder(self._embed_pairs(pairs)))  # (B, S, D) annotations h_j
        s = torch.tanh(self.decoder(self._embed_pairs(previous)))  # (B, T, D) states s_{i-1}
        # alpha_ij = softmax_j(v^T tanh(W s_{i-1} + U h_j)); c_i = sum_j alpha_ij h_j
        context, weights = self.attention(s, h, h, mask)  # (B, T, D), (B, T, S)
        return context, weights

    def read(self, context: torch.Tensor) -> torch.Tensor:
        """Logits for the two numbers of the output pair, read from the context ``c_i``.

        Shapes:
            context: ``(B, T, D)``; returns ``(B, T, 2, num_values)``.
        """
        logits = self.readout(context)  # (B, T, D) -> (B, T, 2V)
        return logits.unflatten(-1, (2, self.num_values))  # (B, T, 2V) -> (B, T, 2, V)

    @torch.no_grad()
    def unshuffle(
        self,
        pairs: torch.Tensor,
        start: torch.Tensor,
        mask: torch.Tensor | None = None,
        num_steps: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Free-running decoding: feed back the pair the model read from ``c_i``.

        ``start`` is the link before each chain (``[v_0, v_1]``). Runs
        ``num_steps`` steps (default ``S``); steps past an example's length
        produce junk that the caller ignores.

        Shapes:
            pairs: ``(B, S, 2)``; start: ``(B, 2)``; mask: ``(B, S)``;
            returns the attended positions ``(B, num_steps)``, the output
            pairs ``(B, num_steps, 2)`` and the weights ``(B, num_steps, S)``.
        """
        start = require_tensor("start", start)
        if tuple(start.shape) != (pairs.shape[0], 2):
            raise ValueError(
                f"start: got shape {shape_str(start.shape)}, expected ({pairs.shape[0]}, 2), "
                f"one start pair per example"
            )
        num_steps = pairs.shape[1] if num_steps is None else num_steps
        check_positive_int("num_steps", num_steps)
        previous = start[:, None, :]  # (B, 2) -> (B, 1, 2)
        chosen, outputs, rows = [], [], []
        for _ in range(num_steps):
            context, weights = self(pairs, previous, mask)  # (B, 1, D), (B, 1, S)
            y = self.read(context).argmax(dim=-1)  # (B, 1, 2, V) -> (B, 1, 2): the output pair
            chosen.append(weights[:, 0].argmax(dim=-1))  # (B,): where step i looked most
            outputs.append(y[:, 0])
            rows.append(weights[:, 0])
            previous = y  # y_i becomes the next step's y_{i-1}
        return torch.stack(chosen, 1), torch.stack(outputs, 1), torch.stack(rows, 1)


def unshuffle_losses(
    model: PairAligner,
    pairs: torch.Tensor,
    previous: torch.Tensor,
    order: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced losses, averaged over the real steps of every example.

    * pointer loss: ``-log alpha_{i, order[i]}``, the cross-entropy of step
      ``i``'s weights against the input position it must copy;
    * read-out loss: the cross-entropy of :meth:`PairAligner.read` ``(c_i)``
      against the two numbers of that pair.

    Shapes:
        pairs, previous: ``(B, L, 2)``; order: ``(B, L)``; mask: ``(B, L)`` bool,
        True at real pairs (the first ``n`` steps are real, like the inputs);
        returns two scalars.
    """
    if tuple(order.shape) != tuple(pairs.shape[:2]) or tuple(mask.shape) != tuple(order.shape):
        raise ValueError(
            f"order, mask: got shapes {shape_str(order.shape)}, {shape_str(mask.shape)}, "
            f"expected {shape_str(pairs.shape[:2])} (B, L) like pairs"
        )
    context, weights = model(pairs, previous, mask)  # (B, L, D), (B, L, L)
    rows = torch.arange(pairs.shape[0], device=pairs.device)[:, None]  # (B, 1)
    targets = pairs[rows, order]  # (B, L, 2): the pair each step must output
    log_alpha = weights.clamp_min(1e-9).log()  # (B, L, L); padded keys have weight 0
    pointer = -log_alpha.gather(-1, order[:, :, None])[..., 0]  # (B, L): -log alpha_{i,order[i]}
    logits = model.read(context)  # (B, L, 2, V)
    readout = F.cross_entropy(logits.flatten(0, 2), targets.flatten(), reduction="none")
    readout = readout.view(targets.shape).sum(-1)  # (B*L*2,) -> (B, L): both numbers
    steps = mask.float()  # (B, L): only real steps count
    return (pointer * steps).sum() / steps.sum(), (readout * steps).sum() / steps.sum()
