"""Check dropout by its properties, whatever random numbers the student drew.

Dropout with probability ``p`` (inverted dropout, as ``nn.Dropout``) sets each
entry to 0 with probability ``p`` and scales the survivors by ``1 / (1 - p)``.
So, compared with the same tensor *without* dropout, every entry of the result
is either exactly 0 or the clean value times ``1 / (1 - p)``, and about a
fraction ``p`` of the (non-zero) clean entries became 0. That is what
`expect_dropout_of` checks: it needs no seed, so a student may draw the random
numbers in any order.
"""

from __future__ import annotations

import math

import torch

from ._compare import fmt_shape
from ._mistakes import says
from ._runner import CaseFailed

_ZERO = 1e-12  # |value| below this counts as exactly zero (float64 inputs)


def is_unchanged(got: torch.Tensor, clean: torch.Tensor) -> bool:
    """True when ``got`` equals ``clean``: nothing was dropped (or rescaled)."""
    got = got.detach().to(torch.float64)
    clean = clean.detach().to(torch.float64)
    return got.shape == clean.shape and bool(torch.allclose(got, clean, atol=1e-6, rtol=1e-5))


def looks_dropped_out(got: torch.Tensor, clean: torch.Tensor, p: float) -> bool:
    """True when every entry of ``got`` is 0 or ``clean / (1 - p)`` and some were dropped."""
    got = got.detach().to(torch.float64)
    clean = clean.detach().to(torch.float64)
    if got.shape != clean.shape:
        return False
    dropped = got.abs() < _ZERO
    kept = torch.isclose(got, clean / (1 - p), atol=1e-6, rtol=1e-5)
    live = clean.abs() > _ZERO
    return bool((dropped | kept).all()) and bool((dropped & live).any())


def expect_dropout_of(
    got,
    clean: torch.Tensor,
    p: float,
    name: str,
    *,
    ignored: str,
    where: str,
) -> None:
    """Fail unless ``got`` is ``clean`` after (inverted) dropout with probability ``p``.

    ``ignored`` is the message when nothing was dropped (dropout never applied);
    ``where`` says where dropout belongs, for the other messages.
    """
    if not isinstance(got, torch.Tensor):
        raise CaseFailed(f"{name}: expected a torch.Tensor, got {type(got).__name__}")
    if tuple(got.shape) != tuple(clean.shape):
        raise CaseFailed(
            f"{name}: expected shape {fmt_shape(clean.shape)}, got {fmt_shape(got.shape)}"
        )
    got = got.detach().cpu().to(torch.float64)
    clean = clean.detach().cpu().to(torch.float64)
    if is_unchanged(got, clean):
        raise CaseFailed(ignored)
    live = clean.abs() > _ZERO
    dropped = (got.abs() < _ZERO) & live
    kept = torch.isclose(got, clean / (1 - p), atol=1e-6, rtol=1e-5)
    unscaled = torch.isclose(got, clean, atol=1e-6, rtol=1e-5)
    if bool((dropped | unscaled | ~live).all()) and bool(dropped.any()):
        raise CaseFailed(
            f"{name}: " + says("dropout-unscaled", entries="entries", scale=1 / (1 - p)),
            mistake="dropout-unscaled",
        )
    kept_as_if = torch.isclose(got, clean / p, atol=1e-6, rtol=1e-5)
    if bool((dropped | kept_as_if | ~live).all()) and not bool((dropped | kept | ~live).all()):
        raise CaseFailed(
            f"{name}: "
            + says(
                "dropout-keep-probability",
                entries="entries",
                p=p,
                one="an entry",
                call="e.g. `F.dropout(w, p=p, training=True)`",
            ),
            mistake="dropout-keep-probability",
        )
    bad = ~(dropped | kept | ~live)
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        raise CaseFailed(
            f"{name}: with dropout p={p:g} in training mode every entry must be either 0 "
            f"(dropped) or the value without dropout times 1 / (1 - p) (kept); at {list(index)} "
            f"the value without dropout is {float(clean[index]):.4g}, yours is "
            f"{float(got[index]):.4g}. Dropout belongs {where}"
        )
    count = int(live.sum())
    fraction = float(dropped.sum()) / max(count, 1)
    slack = 4 * math.sqrt(p * (1 - p) / max(count, 1)) + 0.02
    if abs(fraction - p) > slack:
        raise CaseFailed(
            f"{name}: {fraction:.1%} of the entries were dropped, expected about p = {p:.0%} "
            f"(within {slack:.1%} for {count} entries): `p` is the probability of dropping an "
            "entry, not of keeping it"
        )
