"""What the study scripts share: their command line, the one-thread setting, the
character-level training run, and the JSON file with the same metadata.

The scripts that produce the JSON files the chapters read (``alignment_seeds.py``,
``position_study.py``, ``kv_heads_study.py``, ``study_modern_block.py``,
``induction_seeds.py``, ``kv_cache_generation.py``, ``greedy_loops.py``,
``logit_growth_study.py``, ``recall_study.py``) import it as
``import _study`` (Python puts a script's own folder first on ``sys.path``).

One naming for the same quantity in every file:

- ``machine``: ``{"torch", "python", "threads", "processor"}`` (what the run recorded;
  files written before this module keep the subset their script recorded);
- ``seconds``: the wall time of the whole study (of a rerun, in its entry of ``reruns``;
  of variants added later, in their entry of ``additions``);
  ``train_seconds``: one training run's;
  ``eval_seconds``: one held-out evaluation's;
- ``val_loss``: :func:`attention_course.train.evaluate_lm` on all the held-out text;
- ``train_loss_last50``: the mean training loss of the last 50 steps;
  ``train_loss_last_step``: the last step's training loss.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def parser(
    doc: str, out: Path, *, quick: str | None = None, progress: bool = False, threads: bool = True
) -> argparse.ArgumentParser:
    """The options every study has: ``--out`` (default ``out``), ``--quick`` (a smoke-test
    size, described by ``quick``) when the study has one, ``--no-progress`` when it shows a
    progress bar, ``--threads`` (torch's thread count, default 1, as the committed runs)
    unless the study sets threads itself."""
    result = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    result.add_argument("--out", type=Path, default=out, help=f"default: {out.relative_to(ROOT)}")
    if quick is not None:
        result.add_argument("--quick", action="store_true", help=quick)
    if progress:
        result.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    if threads:
        result.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    return result


def start(args: argparse.Namespace) -> float:
    """Set torch's thread count from ``--threads`` (when the study has it); the start time."""
    if getattr(args, "threads", None) is not None:
        torch.set_num_threads(args.threads)
    return time.perf_counter()


def seed(value: int) -> None:
    """:func:`attention_course.seed_everything` that keeps the thread count the study set
    (``seed_everything`` alone sets the chapters' one thread, whatever ``--threads`` says)."""
    from attention_course import seed_everything

    seed_everything(value, threads=None)


def seconds_since(begin: float) -> float:
    return round(time.perf_counter() - begin, 1)


def machine(*, threads: bool = True, **extra) -> dict:
    """The run's metadata: torch and Python versions, torch's threads (unless each run sets
    its own), the processor, and any ``extra`` notes."""
    result = {"torch": torch.__version__, "python": platform.python_version()}
    if threads:
        result["threads"] = torch.get_num_threads()
    return {**result, "processor": platform.machine(), **extra}


def _rounded(value, digits: int):
    if isinstance(value, float):
        return round(value, digits) if math.isfinite(value) else value
    if isinstance(value, list):
        return [_rounded(v, digits) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    return value


def write(out: Path, data: dict, digits: int | None = None) -> None:
    """Write ``data`` to ``out`` as indented JSON (every float rounded to ``digits``)."""
    if digits is not None:
        data = _rounded(data, digits)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out}")


def finish(out: Path, data: dict, begin: float, digits: int | None = None, **machine_extra):
    """Add the metadata (``machine``, with ``machine_extra``) and the study's ``seconds``
    since ``begin`` to ``data``, :func:`write` it to ``out``, and return it."""
    data = {**data, "machine": machine(**machine_extra), "seconds": seconds_since(begin)}
    write(out, data, digits)
    return data


def char_data():
    """Chapter 13's character-level text: ``(tokenizer, train_ids, val_ids)``, the first
    90 % of :func:`attention_course.data.python_docs` to train on, the last 10 % held out."""
    from attention_course import CharTokenizer
    from attention_course.data import python_docs, split_text

    text = python_docs()
    tokenizer = CharTokenizer(text)
    train_ids, val_ids = split_text(tokenizer.encode(text), 0.1)
    return tokenizer, train_ids, val_ids


def train(model, train_ids, val_ids, training: dict, seed: int, progress: bool) -> dict:
    """:func:`attention_course.train.train_language_model` with the study's ``training``
    (``steps``, ``batch_size``, ``context``, ``lr``): the batches depend only on ``seed``;
    with ``val_ids``, one held-out check of 4,096 tokens at the end. Its history."""
    from attention_course.train import train_language_model

    return train_language_model(
        model,
        train_ids,
        val_ids,
        steps=training["steps"],
        batch_size=training["batch_size"],
        context=training["context"],
        lr=training["lr"],
        eval_every=training["steps"],
        eval_tokens=4096,
        seed=seed,
        progress=progress,
    )


def train_and_score(model, train_ids, val_ids, training: dict, seed: int, progress: bool) -> dict:
    """:func:`train`, then :func:`attention_course.train.evaluate_lm` on all of ``val_ids``:
    ``val_loss``, ``train_loss_last50``, ``train_seconds``, ``tokens_per_second``,
    ``eval_seconds``."""
    from attention_course.train import evaluate_lm

    history = train(model, train_ids, val_ids, training, seed, progress)
    begin = time.perf_counter()
    val = evaluate_lm(model, val_ids, context=training["context"])
    last = history["train_loss"][-50:]
    return {
        "val_loss": val,
        "train_loss_last50": sum(last) / len(last),
        "train_seconds": history["seconds"],
        "tokens_per_second": history["tokens"] / history["seconds"],
        "eval_seconds": time.perf_counter() - begin,
    }
