"""Inputs for the checkers: every drawn input comes from its own seed, and every seed
follows the *run seed*.

A case names the seed of each input it draws (``randn(3, 5, seed=18)``). The run seed
decides what that name means: under run seed 0, the check cells' default, seed 18 is
seed 18, so a notebook's check cell draws the same inputs on every run and its committed
output does not change. The grader draws a fresh run seed for each grading run (on its
own side, with :mod:`secrets`) and records it with every result; under run seed ``r``,
seed 18 becomes a seed derived from ``(r, 18)``. So a table of outputs keyed on the
check cell's inputs does not help in the grader, and ``attention-course grade --seed r``
reproduces a run. Inputs written out by hand (a matrix that exposes one mistake) do not
depend on the run seed.

:func:`drawing_from` sets the run seed for a block (each checker does it with its
``seed`` argument); :func:`generator` and :func:`case_seed` are what every checker uses
to draw.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
from collections.abc import Iterator

import torch

_RUN_SEED: contextvars.ContextVar[int] = contextvars.ContextVar(
    "attention_course_run_seed", default=0
)


def run_seed() -> int:
    """The run seed in force (0 outside :func:`drawing_from`: the check cells' inputs)."""
    return _RUN_SEED.get()


@contextlib.contextmanager
def drawing_from(seed: int) -> Iterator[None]:
    """Within this block, every input a checker draws follows the run seed ``seed``."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    token = _RUN_SEED.set(seed)
    try:
        yield
    finally:
        _RUN_SEED.reset(token)


def case_seed(seed: int) -> int:
    """The seed that the input named ``seed`` is drawn from under the current run seed:
    ``seed`` itself under run seed 0, else a 63-bit seed derived from both (SHA-256, so
    two names never share inputs and no run seed maps onto run seed 0's inputs)."""
    run = _RUN_SEED.get()
    if run == 0:
        return seed
    digest = hashlib.sha256(f"attention_course:{run}:{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def generator(seed: int) -> torch.Generator:
    """A private generator for the input named ``seed`` (the global RNG is untouched)."""
    return torch.Generator().manual_seed(case_seed(seed))


def randn(*shape: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Standard normal values from a private generator (the global RNG is untouched)."""
    return torch.randn(shape, generator=generator(seed), dtype=torch.float64).to(dtype)


def random_bool(*shape: int, seed: int, p: float = 0.6) -> torch.Tensor:
    """A random boolean mask, True with probability ``p``; every row keeps one True."""
    mask = torch.rand(shape, generator=generator(seed)) < p
    mask[..., 0] = True
    return mask


def leaf(t: torch.Tensor) -> torch.Tensor:
    """A fresh copy of ``t`` that requires grad (one for the student, one for the reference)."""
    return t.detach().clone().requires_grad_(True)


REDRAW_STEP = 1_000_003
"""The names of a case's redraws: ``seed``, ``seed + REDRAW_STEP``, ``seed + 2 * REDRAW_STEP``,
... (far from every seed a case names directly)."""


def draw_until(draw, keep, seed: int, tries: int = 200):
    """``draw(name)`` for the names ``seed``, ``seed + REDRAW_STEP``, ...: the first
    result that ``keep`` accepts. For a case whose drawn input must keep a margin (no
    ties, a maximum that grows, a known mistake that shows): any run seed then gives an
    input with that property, so the verdict does not depend on the seed. Under run seed 0
    the first draw is ``draw(seed)``, the input the check cells have always used, whenever
    it has the property."""
    for attempt in range(tries):
        value = draw(seed + attempt * REDRAW_STEP)
        if keep(value):
            return value
    raise RuntimeError(f"no input with the property the case needs in {tries} draws")
