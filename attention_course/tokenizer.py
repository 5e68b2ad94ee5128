"""A character-level tokenizer: one token per character (chapter 13).

The simplest tokenizer there is, and enough to train a real language model on
a few hundred thousand characters: the vocabulary is the sorted set of
characters of a text, a character's id is its position in that list. Byte-pair
encoding (GPT-2's tokenizer) merges frequent pairs into longer tokens; a
character model needs no training and never splits a word unpredictably, at
the price of longer sequences.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral

import torch


class CharTokenizer:
    """Map each character of a text to an integer id and back.

    The vocabulary is ``sorted(set(text))``; ``encode`` turns a string into a
    ``LongTensor`` of ids, ``decode`` turns ids back into the string, so
    ``tok.decode(tok.encode(s)) == s`` for every string ``s`` made of known
    characters. A character the vocabulary does not contain raises
    ``ValueError`` naming it and its position (no silent "unknown" token).

    Hugging Face's tokenizers (``PreTrainedTokenizer``) offer ``encode`` /
    ``decode`` too, with special tokens and batching; this one has neither:
    ``decode`` takes one sequence, and a 2-D batch raises ``ValueError``
    (decode rows one at a time: ``[tok.decode(row) for row in ids]``).

    Shapes:
        encode: ``str`` of length ``T`` -> ``(T,)`` long.
        decode: ``(T,)`` integer tensor or list of ints -> ``str`` of length ``T``.
    """

    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise ValueError(f"text: got {type(text).__name__}, expected a str")
        if not text:
            raise ValueError("text: got an empty string, expected at least one character")
        self.chars: list[str] = sorted(set(text))  # id -> character
        self.stoi: dict[str, int] = {c: i for i, c in enumerate(self.chars)}  # character -> id

    @property
    def vocab_size(self) -> int:
        """The number of distinct characters, ``V``."""
        return len(self.chars)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"

    def encode(self, text: str) -> torch.Tensor:
        """The ids of the characters of ``text``, a ``(T,)`` ``LongTensor``."""
        if not isinstance(text, str):
            raise ValueError(f"text: got {type(text).__name__}, expected a str")
        try:
            ids = [self.stoi[c] for c in text]
        except KeyError:
            position, char = next((i, c) for i, c in enumerate(text) if c not in self.stoi)
            raise ValueError(
                f"text: character {char!r} (U+{ord(char):04X}) at position {position} is not "
                f"in the vocabulary of {self.vocab_size} characters this tokenizer was built from"
            ) from None
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str:
        """The string whose characters have these ids (one sequence, not a batch)."""
        if isinstance(ids, torch.Tensor):
            if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
                raise ValueError(f"ids: got dtype {ids.dtype}, expected an integer tensor")
            if ids.dim() > 1:
                raise ValueError(
                    f"ids: got shape {tuple(ids.shape)}, expected one sequence (T,); decode a "
                    "batch row by row: [tok.decode(row) for row in ids]"
                )
            ids = ids.reshape(-1).tolist()
        else:
            ids = list(ids)
            if not all(isinstance(i, Integral) and not isinstance(i, bool) for i in ids):
                raise ValueError("ids: expected a 1-D integer tensor or a list of ints")
        for position, i in enumerate(ids):
            if not 0 <= i < self.vocab_size:
                raise ValueError(
                    f"ids: id {i} at position {position} is outside the vocabulary "
                    f"[0, {self.vocab_size})"
                )
        return "".join(self.chars[int(i)] for i in ids)
