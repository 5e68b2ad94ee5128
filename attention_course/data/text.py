"""Real English text with no download: the documentation that ships with CPython.

Every CPython installation carries the text of its reference documentation's
topics (the pages ``help("assert")``, ``help("for")``, ... print) in the
standard-library module ``pydoc_data.topics``: a dict from a topic name to
its text. Joined into one string, they make about 465,000 characters of English
prose and code, which Part V uses to train and evaluate character-level language
models (chapter 13).

Each Python release edits its documentation (Python 3.10.13 has 458,995 characters and
104 distinct ones, 3.11.7 has 465,048 and 103, 3.12.1 492,233 and 104), and a chapter's
numbers, a shipped checkpoint's vocabulary and an exercise's answer must not depend on
which Python runs them. So the package ships one snapshot, the topics of Python 3.11.7
(``attention_course/assets/python_docs.txt.xz``, UTF-8, xz-compressed, 95 kB), and
:func:`python_docs` reads it: the same string on every Python. :func:`pydoc_topics_text`
is where the snapshot comes from (``scripts/snapshot_python_docs.py`` writes it).

This module imports nothing outside the standard library (no torch), so that a test can
read the snapshot under another Python.
"""

from __future__ import annotations

import lzma
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

SequenceT = TypeVar("SequenceT", bound=Sequence)

SNAPSHOT = Path(__file__).resolve().parents[1] / "assets" / "python_docs.txt.xz"
# The snapshot's text: Python 3.11.7's pydoc_data topics (tests/test_python_docs_snapshot.py).
SNAPSHOT_SHA256 = "2a95af4ac93f5b719944030ce3769070ddf827d847cba42192afa8da989e5dc4"
SNAPSHOT_PYTHON = "3.11.7"

_TEXT: list[str] = []


def python_docs() -> str:
    """The documentation topics of Python 3.11.7, joined into one string: the course's text.

    Read from the snapshot that ships with the package (decompressed once per process),
    so every Python gives the same string: 465,048 characters, 103 distinct ones. It is
    :func:`pydoc_topics_text` as Python 3.11.7 returns it.

    Shapes:
        returns: a ``str`` of 465,048 characters.
    """
    if not _TEXT:
        _TEXT.append(lzma.decompress(SNAPSHOT.read_bytes()).decode("utf-8"))
    return _TEXT[0]


def pydoc_topics_text() -> str:
    """The documentation topics of the Python that runs this, joined into one string: the
    source of :func:`python_docs`'s snapshot (equal to it on Python 3.11.7 only).

    The topics of ``pydoc_data.topics.topics`` are taken in sorted order of
    their names and joined with a newline (each topic's text already ends
    with one, so topics are separated by a blank line): the same Python gives
    the same string on every machine.

    Raises:
        ImportError: this Python was installed without ``pydoc_data`` (some
            minimal builds and distribution packages leave it out).
    """
    try:
        from pydoc_data.topics import topics
    except ImportError as error:
        raise ImportError(
            "pydoc_topics_text() needs the standard-library module `pydoc_data.topics`, which "
            "this Python was installed without (some minimal builds and Linux packages leave "
            "it out): use a full CPython (python.org, conda, or your distribution's complete "
            "standard library package). python_docs() does not need it."
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
