"""Deterministic inputs for the checkers: every case draws from its own seed."""

from __future__ import annotations

import torch


def randn(*shape: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Standard normal values from a private generator (the global RNG is untouched)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)


def random_bool(*shape: int, seed: int, p: float = 0.6) -> torch.Tensor:
    """A random boolean mask, True with probability ``p``; every row keeps one True."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(shape, generator=generator) < p
    mask[..., 0] = True
    return mask


def leaf(t: torch.Tensor) -> torch.Tensor:
    """A fresh copy of ``t`` that requires grad (one for the student, one for the reference)."""
    return t.detach().clone().requires_grad_(True)
