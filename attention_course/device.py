"""Devices and seeds: the only place where the course chooses hardware.

The library itself never picks a device: every module follows the tensors it is
given. Notebooks call :func:`get_device` once and move their data there.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

ENV_VAR = "ATTENTION_COURSE_DEVICE"


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def _available(device: torch.device) -> bool:
    if device.type == "cpu":
        return True
    if device.type == "cuda":
        return torch.cuda.is_available() and (
            device.index is None or 0 <= device.index < torch.cuda.device_count()
        )
    if device.type == "mps":
        return _mps_available()
    return False


def get_device(prefer: str | torch.device | None = None) -> torch.device:
    """Return the device the notebooks should use.

    Order of precedence:

    1. the ``ATTENTION_COURSE_DEVICE`` environment variable (e.g. ``cpu``,
       ``cuda:1``), so a reader can force a device without editing a notebook;
    2. ``prefer``, when given;
    3. otherwise CUDA, then Apple MPS, then CPU.

    Raises ``ValueError`` when the requested device does not exist on this
    machine, instead of failing later with a less helpful message.
    """
    requested = os.environ.get(ENV_VAR) or prefer
    if requested is None:
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    source = f"environment variable {ENV_VAR}" if os.environ.get(ENV_VAR) else "prefer"
    try:
        device = torch.device(requested)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"{source}: got {requested!r}, expected a device name such as 'cpu', 'cuda', "
            f"'cuda:0' or 'mps'"
        ) from err
    # torch keeps a device index in 8 bits: "cuda:1000" becomes cuda:-24 (seen with torch
    # 2.11 on a CUDA machine), so the index asked for is read from the text as well.
    asked = str(requested).rpartition(":")[2]
    wrapped = asked.isdigit() and device.index is not None and int(asked) != device.index
    if wrapped or not _available(device):
        raise ValueError(
            f"{source}: got {requested!r}, but that device is not available on this machine "
            f"(CUDA available: {torch.cuda.is_available()}, MPS available: {_mps_available()})"
        )
    return device


CHAPTER_THREADS = 1
"""PyTorch's CPU threads in the chapters and exercises (set by :func:`seed_everything`).

One, because the course's matrices are small and its machines are often shared. Measured
with ``benchmarks/threads.py`` on the course's 2-core machine (torch 2.13, 7 interleaved
repeats; ``benchmarks/README.md`` has the table): with nothing else running, a second
thread changed the time of three chapter workloads by factors between 0.54 and 1.25
(medians 0.67 for chapter 13's training step, 1.06 for chapter 3's, 0.86 for one
attention call); while another process trained, it made them between 1.1 and 99 times
slower (medians 2.2, 40 and 26). The factors under load vary widely from run to run;
their direction did not. With one thread, the thread count is also one thing less that
changes the order of floating-point sums (the instruction set, the BLAS library and the
device still can: the notebooks print rounded numbers for that).
"""


def seed_everything(seed: int = 0, *, threads: int | None = CHAPTER_THREADS) -> None:
    """Seed Python's ``random``, NumPy and PyTorch (CPU and every CUDA device), and set
    PyTorch's CPU thread count to ``threads`` (:data:`CHAPTER_THREADS`; ``None`` leaves it).

    Seeding makes a notebook's random numbers repeatable on one machine; the
    notebooks additionally print rounded numbers so that CPU and GPU agree. The thread
    count is set here, in the one call every chapter and exercise makes first, so that
    it is chosen in one place (:data:`CHAPTER_THREADS` says why one).
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed: got {seed!r} ({type(seed).__name__}), expected an int")
    if threads is not None and (
        not isinstance(threads, int) or isinstance(threads, bool) or threads < 1
    ):
        raise ValueError(f"threads: got {threads!r}, expected a positive int or None")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
