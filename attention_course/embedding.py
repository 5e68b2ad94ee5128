"""What every token model here shares: checking token ids, embedding them, initialising.

Used by :class:`~attention_course.Transformer` and
:class:`~attention_course.TransformerClassifier`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._validate import require_ndim

# What nn.Embedding accepts as indices.
_TOKEN_DTYPES = (torch.long, torch.int)


def check_token_ids(name: str, tokens: object, vocab_size: int, max_len: int) -> None:
    """``tokens`` must be ``(B, L)`` integer ids with ``1 <= L <= max_len``, each in the vocabulary.

    An id outside ``[0, vocab_size)`` raises a ``ValueError`` naming the argument and
    the vocabulary size (``nn.Embedding`` would say only "index out of range in self").
    The range test costs one device synchronisation; the extremes are computed only
    to write the message.
    """
    if not isinstance(tokens, torch.Tensor):
        raise ValueError(f"{name}: got {type(tokens).__name__}, expected a LongTensor (B, L)")
    require_ndim(name, tokens, (2,), "(B, L) token ids")
    if tokens.dtype not in _TOKEN_DTYPES:
        raise ValueError(f"{name}: got dtype {tokens.dtype}, expected integer token ids")
    if not 1 <= tokens.shape[1] <= max_len:
        raise ValueError(
            f"{name}: got length {tokens.shape[1]}, expected 1 to max_len={max_len} tokens"
        )
    if tokens.numel() and bool(((tokens < 0) | (tokens >= vocab_size)).any()):
        low, high = int(tokens.min()), int(tokens.max())
        raise ValueError(
            f"{name}: got token ids in [{low}, {high}], expected ids in [0, {vocab_size - 1}] "
            f"(vocabulary size {vocab_size})"
        )


def embed_tokens(embedding: nn.Embedding, positional: nn.Module, tokens, start: int = 0):
    """Token embedding times ``sqrt(d_model)``, plus the positions ``start, start + 1, ...``.

    The paper multiplies by ``sqrt(d_model)`` (section 3.4, no reason given). One
    reading: it keeps the embeddings comparable in size to the positional encoding;
    whether it does depends on the initialisation and the vocabulary size (chapter 9).

    Shapes: tokens ``(B, L)``; returns ``(B, L, D)``.
    """
    x = embedding(tokens) * math.sqrt(embedding.embedding_dim)  # (B, L) -> (B, L, D)
    return positional(x, start=start)


def xavier_init_(model: nn.Module) -> None:
    """Xavier-uniform for every weight matrix (and embedding table), as ``nn.Transformer`` does."""
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
