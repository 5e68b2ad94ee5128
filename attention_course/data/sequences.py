"""Sequence-to-sequence toy tasks on digit strings: copy, reverse, sort.

Token ids: ``PAD = 0``, ``BOS = 1``, ``EOS = 2``, symbols ``3 .. 3 + num_symbols - 1``.
Sources are padded on the right with PAD; targets are ``BOS, answer..., EOS``
padded with PAD, so ``tgt[:, :-1]`` is the decoder input (teacher forcing) and
``tgt[:, 1:]`` the labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PAD, BOS, EOS = 0, 1, 2
FIRST_SYMBOL = 3
_TASKS = ("copy", "reverse", "sort")


@dataclass
class SequenceTask:
    """A generated data set.

    Shapes:
        src: ``(N, max_len)``; tgt: ``(N, max_len + 2)``; lengths: ``(N,)``.
    """

    src: torch.Tensor
    tgt: torch.Tensor
    lengths: torch.Tensor
    vocab_size: int

    def __len__(self) -> int:
        return self.src.shape[0]


def make_sequence_task(
    task: str,
    num_samples: int,
    min_len: int,
    max_len: int,
    num_symbols: int = 10,
    seed: int = 0,
) -> SequenceTask:
    """Random symbol strings and their copy, reversal or sorted version.

    Uses its own ``torch.Generator`` so the data does not depend on (or
    disturb) the global random state.
    """
    if task not in _TASKS:
        raise ValueError(f"task: got {task!r}, expected one of {_TASKS}")
    if not 1 <= min_len <= max_len:
        raise ValueError(f"min_len, max_len: got {min_len}, {max_len}, expected 1 <= min <= max")
    if num_samples < 1 or num_symbols < 1:
        raise ValueError(
            f"num_samples, num_symbols: got {num_samples}, {num_symbols}, expected >= 1"
        )
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (num_samples,), generator=gen)
    symbols = torch.randint(
        FIRST_SYMBOL, FIRST_SYMBOL + num_symbols, (num_samples, max_len), generator=gen
    )
    src = torch.full((num_samples, max_len), PAD, dtype=torch.long)
    tgt = torch.full((num_samples, max_len + 2), PAD, dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        seq = symbols[i, :n]
        if task == "reverse":
            answer = seq.flip(0)
        elif task == "sort":
            answer = seq.sort().values
        else:
            answer = seq
        src[i, :n] = seq
        tgt[i, 0] = BOS
        tgt[i, 1 : n + 1] = answer
        tgt[i, n + 1] = EOS
    return SequenceTask(src, tgt, lengths, vocab_size=FIRST_SYMBOL + num_symbols)
