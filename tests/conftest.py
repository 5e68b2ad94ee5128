"""Shared fixtures for the package's tests.

Every test starts from the same random state (``seed_everything(0)``), so a
failure reproduces exactly. Helpers that several files need are fixtures here
(not an importable module), so they work whatever pytest's import mode is.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attention_course import seed_everything

ROOT = Path(__file__).resolve().parents[1]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(autouse=True)
def _seed_every_test():
    seed_everything(0)


def _randomize(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Give every parameter of ``module`` random, non-default values, in place.

    Default initialisations hide bugs: LayerNorm starts at weight 1 / bias 0,
    so swapping two norms or forgetting an affine step changes nothing. Matrices
    get N(0, 1/fan_in), LayerNorm/BatchNorm weights 1 + N(0, 0.3^2), every other
    vector N(0, 0.3^2).
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if p.dim() > 1:
                value = noise / math.sqrt(p.shape[-1])
            elif ("norm" in name and name.endswith("weight")) or name == "weight":
                value = 1.0 + 0.3 * noise
            else:
                value = 0.3 * noise
            p.copy_(value.to(p.dtype))
    return module


@pytest.fixture
def randomize():
    """``randomize(module, seed=0)``: random non-default parameters, in place."""
    return _randomize


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    """Every device this machine has (CPU, and CUDA when present)."""
    return torch.device(request.param)


def _run_script(name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    process = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )
    assert process.returncode == 0, f"scripts/{name} {' '.join(args)}:\n{process.stderr}"
    return process


@pytest.fixture
def run_script():
    """``run_script("name.py", *args, timeout=300)``: run ``scripts/name.py`` from the
    repository root in a fresh Python on one thread; fails the test, with the script's
    stderr, unless it exits 0; returns the finished process (``.stdout``, ``.stderr``)."""
    return _run_script
