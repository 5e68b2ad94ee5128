"""Real English text with no download: the documentation that ships with CPython.

Every CPython installation carries the text of its reference documentation's
topics (the pages ``help("assert")``, ``help("for")``, ... print) in the
standard-library module ``pydoc_data.topics``: a dict from a topic name to
its text. :func:`python_docs` joins them into one string, about 465,000
characters of English prose and code, which Part V uses to train and
evaluate character-level language models (chapter 13).

The text depends a little on the Python version (each release edits its
documentation): on Python 3.11.7 it has 465,048 characters and 103 distinct
characters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

SequenceT = TypeVar("SequenceT", bound=Sequence)


def python_docs() -> str:
    """The documentation topics of this Python, joined into one string.

    The topics of ``pydoc_data.topics.topics`` are taken in sorted order of
    their names and joined with a newline (each topic's text already ends
    with one, so topics are separated by a blank line): the same Python gives
    the same string on every machine.

    Shapes:
        returns: a ``str`` of about 465,000 characters (465,048 on Python 3.11.7).

    Raises:
        ImportError: this Python was installed without ``pydoc_data`` (some
            minimal builds and distribution packages leave it out).
    """
    try:
        from pydoc_data.topics import topics
    except ImportError as error:
        raise ImportError(
            "python_docs() needs the standard-library module `pydoc_data.topics`, which this "
            "Python was installed without (some minimal builds and Linux packages leave it "
            "out): use a full CPython (python.org, conda, or your distribution's complete "
            "standard library package)"
        ) from error
    return "\n".join(topics[name] for name in sorted(topics))


def split_text(text: SequenceT, val_fraction: float = 0.1) -> tuple[SequenceT, SequenceT]:
    """Split a text by position: the first part to train on, the last ``val_fraction`` held out.

    A split by position, not at random: the held-out part is a contiguous
    stretch at the end, so most of it is text the model never saw and the
    validation loss measures generalisation more than recall of neighbouring
    text. Not all of it is new: a text that repeats itself (documentation
    boilerplate, say) has passages in both parts; on ``python_docs()`` about
    8 % of the held-out 64-character pieces also occur verbatim in the
    training part. The held-out part has ``round(len(text) * val_fraction)``
    items.

    Works on anything that has a length and slices: a ``str``, a list, or a
    1-D tensor of token ids.

    Shapes:
        text: ``(N,)``; returns ``(train (N - N_val,), val (N_val,))`` of the same type.

    Raises:
        ValueError: ``val_fraction`` is not in (0, 1), or either part would be empty.
    """
    if (
        not isinstance(val_fraction, (int, float))
        or isinstance(val_fraction, bool)
        or not 0.0 < val_fraction < 1.0
    ):
        raise ValueError(f"val_fraction: got {val_fraction!r}, expected a number in (0, 1)")
    n = len(text)
    n_val = round(n * val_fraction)
    if n_val == 0 or n_val == n:
        raise ValueError(
            f"text: got {n} items, too few to hold out a fraction {val_fraction} and keep both "
            "parts non-empty"
        )
    return text[: n - n_val], text[n - n_val :]
