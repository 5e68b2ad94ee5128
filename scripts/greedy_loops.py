"""Chapter 13's greedy-decoding survey: which prompts send the checkpoint into a loop.

Run from the repository root (a minute or two on one thread of a shared 2-core machine)::

    python scripts/greedy_loops.py                        # one thread (--threads)
    python scripts/greedy_loops.py --prompts 2 --tokens 40 --out /tmp/loops.json   # a smoke test

The prompts are not chosen by hand: they are the ``prompts`` words that most often begin a
sentence (after ". ") in the training part of :func:`~attention_course.data.python_docs`,
each followed by a space. From each, the shipped checkpoint
(:func:`~attention_course.load_gpt_checkpoint`) decodes ``tokens`` characters greedily
(temperature 0, without the cache, so that its 128-character window slides along the text).
A text *ends in a loop* when its last 100 characters repeat with a period of at most 30
characters (``loop_period``); the loop starts where that periodic tail begins. The results
go to ``book/data/greedy_loops.json``; ``book/13_decoder_only.ipynb`` reads them and
re-generates one prompt live to check the file. The command line and the JSON's metadata are
the other studies' (``scripts/_study.py``).
"""

from __future__ import annotations

import collections
import re

import _study
import torch

from attention_course import CharTokenizer, generate, load_gpt_checkpoint
from attention_course.data import python_docs, split_text

DEFAULT_OUT = _study.ROOT / "book" / "data" / "greedy_loops.json"


def loop_period(text: str, tail: int = 100, longest: int = 30) -> int | None:
    """The shortest period p <= longest with which the last ``tail`` characters repeat."""
    end = text[-tail:]
    if len(end) < tail:
        return None
    return next((p for p in range(1, longest + 1) if end[p:] == end[:-p]), None)


def loop_start(text: str, period: int) -> int:
    """The first index from which ``text`` repeats with ``period`` to its end."""
    i = len(text) - period
    while i > 0 and text[i - 1] == text[i - 1 + period]:
        i -= 1
    return i


def sentence_starters(text: str, count: int) -> list[str]:
    """The ``count`` words that most often begin a sentence (after ". ") in ``text``."""
    words = collections.Counter(re.findall(r"\. ([A-Z][a-z]*) ", text))
    return [word for word, _ in words.most_common(count)]


@torch.no_grad()
def survey(prompts: int, tokens: int) -> dict:
    text = python_docs()
    tok = CharTokenizer(text)
    train_ids, _ = split_text(tok.encode(text), 0.1)
    model = load_gpt_checkpoint()
    rows = []
    for word in sentence_starters(text[: len(train_ids)], prompts):
        prompt = word + " "
        out = generate(
            model, tok.encode(prompt).unsqueeze(0), tokens, temperature=0, use_cache=False
        )
        greedy = tok.decode(out[0])
        period = loop_period(greedy)
        start = loop_start(greedy, period) if period else None
        rows.append({"prompt": prompt, "text": greedy, "loop_period": period, "loop_start": start})
    return {"tokens": tokens, "results": rows}


def main(argv=None) -> dict:
    parser = _study.parser(__doc__, DEFAULT_OUT)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=600)
    args = parser.parse_args(argv)
    start = _study.start(args)
    result = _study.finish(args.out, survey(args.prompts, args.tokens), start)
    for row in result["results"]:
        print(f"{row['prompt']!r:8} loop period {row['loop_period']}, from {row['loop_start']}")
    return result


if __name__ == "__main__":
    main()
