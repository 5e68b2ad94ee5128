"""Toy tasks generated in memory, and real text that ships with Python (nothing is
ever downloaded).

Each task lives in its own module; import it from there, e.g.
``from attention_course.data.sequences import make_sequence_task``.
"""

from .repeated import repeated_tokens
from .sentiment import make_sentiment_task
from .sequences import BOS, EOS, FIRST_SYMBOL, PAD, SequenceTask, make_sequence_task
from .text import python_docs, split_text
from .unshuffle import make_unshuffle_task

__all__ = [
    "BOS",
    "EOS",
    "FIRST_SYMBOL",
    "PAD",
    "SequenceTask",
    "make_sentiment_task",
    "make_sequence_task",
    "make_unshuffle_task",
    "python_docs",
    "repeated_tokens",
    "split_text",
]
