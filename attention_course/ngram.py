"""Counting baselines for language models: character n-gram models (chapter 13).

An n-gram model predicts the next token from the ``n - 1`` tokens before it,
with probabilities estimated by counting in the training text. With add-alpha
("Lidstone") smoothing over a vocabulary of ``V`` tokens,

    p(c | ctx) = (count(ctx, c) + alpha) / (count(ctx) + alpha * V),

so a context never seen in training gets the uniform distribution ``1 / V``.
Its held-out cross-entropy is the bar a neural language model must clear:
on :func:`attention_course.data.python_docs` (last 10 % held out, alpha =
0.05) a unigram model scores 3.24 nats/char, a bigram 2.32 and a 4-gram 1.48.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _as_ids(name: str, ids: torch.Tensor | Sequence[int], vocab_size: int) -> torch.Tensor:
    """A 1-D long tensor of ids in ``[0, vocab_size)``, or ValueError naming ``name``."""
    if not isinstance(ids, torch.Tensor):
        ids = torch.as_tensor(ids)
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise ValueError(f"{name}: got dtype {ids.dtype}, expected integer token ids")
    if ids.dim() != 1:
        raise ValueError(f"{name}: got shape {tuple(ids.shape)}, expected a 1-D sequence (N,)")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(
            f"{name}: got ids in [{int(ids.min())}, {int(ids.max())}], expected every id in "
            f"[0, vocab_size={vocab_size})"
        )
    return ids.detach().to(device="cpu", dtype=torch.long)


class NGramModel:
    """A character n-gram model with add-alpha smoothing, fitted by counting.

    ``order=1`` is the unigram model (no context), ``order=2`` the bigram
    model (one token of context), and so on. Counts are kept for the
    (context, next) pairs seen in training only: each is hashed to one integer,
    ``context_0 * V^(n-2) + ... + context_{n-2}`` (then ``* V + next``), and
    counted with ``torch.unique``; a lookup is a ``torch.searchsorted`` into
    the sorted keys. No Python loop runs over the characters.

    ``cross_entropy(ids)`` scores every position that has a full context,
    positions ``order - 1`` to ``N - 1``: the mean of ``-log p(ids[t] |
    ids[t - order + 1 : t])`` in nats per token (divide by ``ln 2`` for bits).

    Shapes:
        fit / cross_entropy: ids ``(N,)`` integers in ``[0, vocab_size)``.
    """

    def __init__(self, order: int, vocab_size: int, alpha: float = 0.05) -> None:
        for name, value in (("order", order), ("vocab_size", vocab_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: got {value!r}, expected a positive int")
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not alpha > 0:
            raise ValueError(f"alpha: got {alpha!r}, expected a positive number")
        if vocab_size**order >= 2**63:
            raise ValueError(
                f"order: {order} with vocab_size={vocab_size} gives keys over 2**63: hashing "
                "(context, next) into one int64 needs vocab_size ** order < 2 ** 63"
            )
        self.order = order
        self.vocab_size = vocab_size
        self.alpha = float(alpha)
        self._pair_keys: torch.Tensor | None = None

    def _keys(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Hash each position's context (the order - 1 ids before it) to one integer."""
        n = ids.numel() - self.order + 1  # positions with a full context
        context = torch.zeros(n, dtype=torch.long)
        for j in range(self.order - 1):  # a loop over the order, not over the text
            context = context * self.vocab_size + ids[j : j + n]
        return context, context * self.vocab_size + ids[self.order - 1 :]

    def fit(self, ids: torch.Tensor | Sequence[int]) -> NGramModel:
        """Count the (context, next) pairs and the contexts of ``ids``; returns ``self``."""
        ids = _as_ids("ids", ids, self.vocab_size)
        if ids.numel() < self.order:
            raise ValueError(f"ids: got {ids.numel()} tokens, expected at least order={self.order}")
        context, pair = self._keys(ids)
        self._pair_keys, self._pair_counts = torch.unique(pair, return_counts=True)  # sorted
        self._context_keys, self._context_counts = torch.unique(context, return_counts=True)
        return self

    @staticmethod
    def _lookup(keys: torch.Tensor, counts: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """The count of each query key (0 for a key never seen)."""
        where = torch.searchsorted(keys, query).clamp(max=keys.numel() - 1)
        return torch.where(keys[where] == query, counts[where], 0)

    def log_probs(self, ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """``log p(ids[t] | context)`` for t = order - 1, ..., N - 1: a ``(N - order + 1,)``
        float64 tensor."""
        if self._pair_keys is None:
            raise RuntimeError("call fit(ids) before scoring: the model has no counts yet")
        ids = _as_ids("ids", ids, self.vocab_size)
        if ids.numel() < self.order:
            raise ValueError(f"ids: got {ids.numel()} tokens, expected at least order={self.order}")
        context, pair = self._keys(ids)
        pair_count = self._lookup(self._pair_keys, self._pair_counts, pair).double()
        context_count = self._lookup(self._context_keys, self._context_counts, context).double()
        # Add-alpha smoothing; an unseen context gives alpha / (alpha * V) = 1 / V.
        probs = (pair_count + self.alpha) / (context_count + self.alpha * self.vocab_size)
        return probs.log()

    def cross_entropy(self, ids: torch.Tensor | Sequence[int]) -> float:
        """The mean negative log-likelihood of ``ids``, in nats per token."""
        return float(-self.log_probs(ids).mean())

    def __repr__(self) -> str:
        return f"NGramModel(order={self.order}, vocab_size={self.vocab_size}, alpha={self.alpha})"
