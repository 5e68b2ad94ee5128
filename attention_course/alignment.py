"""A tiny encoder/decoder that learns to align with additive attention (chapter 3).

The model solves the unshuffle task (:mod:`attention_course.data.unshuffle`):
the encoder turns every input pair into an annotation ``h_j``; the decoder
turns the previous output pair into a state ``s_{i-1}``; Bahdanau's alignment
model (:class:`attention_course.AdditiveAttention`) scores every ``h_j``
against ``s_{i-1}``. The attention weights are the prediction itself: the
pair to output next is the one attended to (a "pointer", Vinyals et al. 2015).
"""

from __future__ import annotations

import torch
from torch import nn

from ._validate import require_ndim, shape_str
from .attention import AdditiveAttention


class PairAligner(nn.Module):
    """Encoder, decoder state and additive attention over pairs of small integers.

    The task needs no memory beyond the previous output, so the decoder state
    is computed from the previous pair alone (Bahdanau's decoder is an RNN).
    Nothing here knows the input positions: the alignment is found by content.

    Shapes:
        pairs: ``(B, S, 2)`` long; previous: ``(B, T, 2)`` long;
        returns weights ``(B, T, S)``: row ``i`` is the alignment of step ``i``.
    """

    def __init__(self, num_values: int, d_model: int = 32, hidden_dim: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(num_values, d_model)
        self.encoder = nn.Linear(2 * d_model, d_model)  # a pair -> annotation h_j
        self.decoder = nn.Linear(2 * d_model, d_model)  # previous pair -> state s_{i-1}
        self.attention = AdditiveAttention(d_model, d_model, hidden_dim)

    def _embed_pairs(self, pairs: torch.Tensor) -> torch.Tensor:
        x = self.embed(pairs)  # (B, L, 2) -> (B, L, 2, D)
        return x.flatten(-2)  # (B, L, 2, D) -> (B, L, 2D): both numbers side by side

    def forward(self, pairs: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        require_ndim("pairs", pairs, (3,), "(B, S, 2)")
        require_ndim("previous", previous, (3,), "(B, T, 2)")
        if pairs.shape[-1] != 2 or previous.shape[-1] != 2:
            raise ValueError(
                f"pairs, previous: got shapes {shape_str(pairs.shape)}, "
                f"{shape_str(previous.shape)}, expected (B, S, 2) and (B, T, 2)"
            )
        h = torch.tanh(self.encoder(self._embed_pairs(pairs)))  # (B, S, D) annotations h_j
        s = torch.tanh(self.decoder(self._embed_pairs(previous)))  # (B, T, D) states s_{i-1}
        _, weights = self.attention(s, h, h)  # alpha_ij = softmax_j(v^T tanh(W s_i + U h_j))
        return weights  # (B, T, S)

    @torch.no_grad()
    def unshuffle(
        self, pairs: torch.Tensor, start: tuple[int, int] = (0, 1)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Free-running decoding: feed back the model's own choice at every step.

        Returns the chosen input positions ``(B, S)`` and the alignment weights
        ``(B, S, S)`` (row ``i``: step ``i``'s weights over the inputs).
        """
        B, S, _ = pairs.shape
        previous = torch.tensor(start, device=pairs.device).expand(B, 1, 2)  # (B, 1, 2)
        chosen, rows = [], []
        for _ in range(S):
            weights = self(pairs, previous)[:, 0]  # (B, 1, S) -> (B, S)
            index = weights.argmax(dim=-1)  # (B,)
            previous = pairs[torch.arange(B, device=pairs.device), index][:, None]  # (B, 1, 2)
            chosen.append(index)
            rows.append(weights)
        return torch.stack(chosen, dim=1), torch.stack(rows, dim=1)  # (B, S), (B, S, S)
