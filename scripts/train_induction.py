"""Train chapter 17's attention-only model and save it as exercise 17's shipped asset.

Run from the repository root (seeded; one thread, as chapter 17 trains it)::

    python scripts/train_induction.py                     # attention_course/assets/induction17.pt
    python scripts/train_induction.py --out /tmp/ind.pt   # anywhere else

It calls :func:`attention_course.interpret.train_induction_model` (seed 0, 300 AdamW
steps on repeated random tokens, the loop of chapter 17) with ``torch.set_num_threads(1)``
and saves ``config`` (the :class:`~attention_course.GPT` constructor's arguments),
``state_dict`` (float32 weights, about 150 kB) and ``info`` (the training settings, the
torch version and the CPU capability torch used) to the file that
:func:`attention_course.interpret.load_induction_model` reads.

Why a file: three hundred optimiser steps amplify rounding, so the same seed gives
slightly different weights on another CPU, BLAS or thread count (chapter 17's
reproducibility note), and with them a different best head in a near tie. Exercise 17 and
its checkers read this file instead, so their answers are the same on every machine.
``tests/test_determinism.py`` retrains it here and compares the induction scores.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from attention_course.interpret import (
    INDUCTION_CONFIG,
    INDUCTION_TRAINING,
    load_induction_model,
    train_induction_model,
)

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "attention_course" / "assets" / "induction17.pt"


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    torch.set_num_threads(1)  # as chapter 17 trains it
    model = train_induction_model(**INDUCTION_TRAINING)
    state = {k: v.detach().float().contiguous().clone() for k, v in model.state_dict().items()}
    info = dict(  # what the bits depend on: tests/test_determinism.py compares them
        INDUCTION_TRAINING,
        threads=1,
        torch=str(torch.__version__),
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
    )
    torch.save({"config": INDUCTION_CONFIG, "state_dict": state, "info": info}, args.out)
    loaded = load_induction_model(args.out)  # the file reads back as the same model
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, state[key]), key
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    return args.out


if __name__ == "__main__":
    main()
