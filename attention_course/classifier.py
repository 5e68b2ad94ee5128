"""An encoder-only Transformer for sequence classification (chapter 11).

The course's ``TransformerClassifier``: token embedding (scaled by
``sqrt(d_model)``) plus positional encoding, the course's :class:`Encoder`,
**pooling over time** (one vector per sentence, whatever its length), and a
linear layer to class logits. The padding mask is built from ``pad_id`` and used
twice: in self-attention (no real token attends to padding) and in the pooling
(padding does not enter the average or the maximum). Without the second, the
pooled vector, and so the prediction, changes when a sentence is padded more.

BERT (Devlin et al., 2019) reads the output at a special ``[CLS]`` position
instead of pooling. The classifier of the same name in the source notes (see the
book's introduction) uses the mask in neither place: its encoder gets no attention
mask, so real tokens attend to ``<pad>``, and it applies the linear layer at every
position and takes, for each class, the maximum score over time, ``<pad>``
positions included. Both let the amount of padding change the answer, the mistake
chapter 11 measures. Here ``pooling="max"`` uses :func:`masked_max_pool` and
``pooling="mean"`` (the default) :func:`masked_mean_pool`; both ignore the
padding.
"""

from __future__ import annotations

import torch
from torch import nn

from ._validate import check_positive_int, require_float, require_ndim, shape_str
from .embedding import check_token_ids, embed_tokens, xavier_init_
from .fused import AttentionMask
from .positional import PositionalEncoding
from .transformer import Encoder

_POOLINGS = ("mean", "max")


def _check_pool_inputs(x: object, mask: object) -> None:
    x = require_float("x", x)
    require_ndim("x", x, (3,), "(B, T, D)")
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(
            f"mask: got {got}, expected a torch.bool tensor (B, T), True at real tokens"
        )
    if tuple(mask.shape) != tuple(x.shape[:2]):
        raise ValueError(
            f"mask: got shape {shape_str(mask.shape)}, expected {shape_str(x.shape[:2])}, "
            f"the (B, T) of x {shape_str(x.shape)}"
        )


def masked_mean_pool(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Average over time, counting only the positions where ``mask`` is True.

    ``out[b] = sum_t mask[b, t] * x[b, t] / sum_t mask[b, t]``. With
    ``mask=None`` every position counts (a plain ``x.mean(dim=1)``, which is
    wrong for padded batches). A row with no real token gives zeros, not NaN.

    Shapes:
        x: ``(B, T, D)``; mask: ``(B, T)`` bool, True at real tokens;
        returns ``(B, D)``.
    """
    _check_pool_inputs(x, mask)
    if mask is None:
        return x.mean(dim=1)  # (B, T, D) -> (B, D)
    weights = mask.to(x.dtype)[:, :, None]  # (B, T) -> (B, T, 1)
    total = (x * weights).sum(dim=1)  # (B, T, D) -> (B, D)
    count = weights.sum(dim=1).clamp(min=1.0)  # (B, 1); at least 1: no 0 / 0
    return total / count


def masked_max_pool(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Maximum over time of each feature, over the positions where ``mask`` is True.

    Padded positions are replaced by the dtype's most negative finite value
    before the maximum, so they can never win. With ``mask=None`` every
    position counts. A row with no real token gives zeros, not ``-inf``.

    Shapes:
        x: ``(B, T, D)``; mask: ``(B, T)`` bool, True at real tokens;
        returns ``(B, D)``.
    """
    _check_pool_inputs(x, mask)
    if mask is None:
        return x.max(dim=1).values  # (B, T, D) -> (B, D)
    lowest = torch.finfo(x.dtype).min
    out = x.masked_fill(~mask[:, :, None], lowest).max(dim=1).values  # (B, T, D) -> (B, D)
    empty = ~mask.any(dim=1)  # (B,): rows with no real token
    return out.masked_fill(empty[:, None], 0.0)


class TransformerClassifier(nn.Module):
    """Embedding + positions, a Transformer encoder, pooling over time, a linear layer.

    ``forward(tokens)`` builds the padding mask itself from ``pad_id``
    (``tokens != pad_id``), masks the encoder's self-attention keys with it
    and pools only over real tokens, so the logits do not depend on how much
    padding follows a sentence. Dropout is active in training mode only.

    Shapes:
        tokens: ``(B, T)`` token ids (``T <= max_len``); returns logits
        ``(B, num_classes)``.
    """

    def __init__(
        self,
        vocab_size: int,
        num_classes: int,
        d_model: int = 64,
        num_heads: int = 4,
        num_layers: int = 2,
        d_ff: int = 128,
        dropout: float = 0.1,
        max_len: int = 512,
        pad_id: int = 0,
        pooling: str = "mean",
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        check_positive_int("vocab_size", vocab_size)
        check_positive_int("num_classes", num_classes)
        check_positive_int("max_len", max_len)
        if not isinstance(pad_id, int) or isinstance(pad_id, bool) or not 0 <= pad_id < vocab_size:
            raise ValueError(f"pad_id: got {pad_id!r}, expected an int in [0, {vocab_size})")
        if pooling not in _POOLINGS:
            raise ValueError(f"pooling: got {pooling!r}, expected one of {_POOLINGS}")
        self.d_model = d_model
        self.vocab_size = vocab_size
        self.max_len = max_len
        self.pad_id = pad_id
        self.pooling = pooling
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.positional = PositionalEncoding(d_model, max_len, dropout)
        self.encoder = Encoder(num_layers, d_model, num_heads, d_ff, dropout, norm_first)
        self.output_layer = nn.Linear(d_model, num_classes)
        xavier_init_(self)

    def encode(self, tokens: torch.Tensor, return_attention: bool = False):
        """Contextual vectors for every position, and the mask of real tokens.

        Shapes:
            tokens: ``(B, T)``; returns ``(hidden (B, T, D), keep (B, T) bool)``,
            plus a list of per-layer self-attention weights ``(B, H, T, T)``
            if ``return_attention``.
        """
        check_token_ids("tokens", tokens, self.vocab_size, self.max_len)
        keep = tokens != self.pad_id  # (B, T): True at real tokens
        x = embed_tokens(self.embedding, self.positional, tokens)  # (B, T) -> (B, T, D)
        # (B, T) -> (B, 1, 1, T): no query attends to padding; one mask for every layer,
        # converted once for the fused kernel
        key_mask = AttentionMask(keep[:, None, None, :])
        out = self.encoder(x, key_mask, return_attention=return_attention)
        if return_attention:
            hidden, weights = out
            return hidden, keep, weights
        return out, keep

    def pool(self, hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Pool ``hidden (B, T, D)`` over the real tokens ``keep (B, T)`` -> ``(B, D)``."""
        if self.pooling == "mean":
            return masked_mean_pool(hidden, keep)
        return masked_max_pool(hidden, keep)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, keep = self.encode(tokens)
        return self.output_layer(self.pool(hidden, keep))  # (B, D) -> (B, num_classes)
