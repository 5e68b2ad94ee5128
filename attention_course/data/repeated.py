"""Repeated random tokens: the synthetic task on which induction heads form (chapter 17).

Each sequence is ``period`` random tokens followed by the same ``period`` tokens
again. The first half is unpredictable; the second half can be predicted
perfectly by copying from the first: the in-context copying that an induction
head implements (Olsson et al., 2022, "In-context Learning and Induction Heads").
"""

from __future__ import annotations

from numbers import Integral

import torch


def _require_int(name: str, value: object, low: int) -> None:
    if not isinstance(value, Integral) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name}: got {value!r}, expected an int >= {low}")


def repeated_tokens(
    num_sequences: int,
    period: int,
    vocab_size: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``num_sequences`` random token sequences whose second half repeats the first.

    Tokens are drawn uniformly from ``0 .. vocab_size - 1`` (with replacement),
    so ``out[:, period:] == out[:, :period]``. Pass a seeded
    ``torch.Generator`` for the same sequences on every run.

    Shapes:
        returns a LongTensor ``(num_sequences, 2 * period)`` on the CPU.

    Raises:
        ValueError: ``num_sequences < 1``, ``period < 1`` or ``vocab_size < 1``.
    """
    _require_int("num_sequences", num_sequences, 1)
    _require_int("period", period, 1)
    _require_int("vocab_size", vocab_size, 1)
    first = torch.randint(vocab_size, (num_sequences, period), generator=generator)
    return torch.cat([first, first], dim=1)  # (B, period) -> (B, 2 * period)
