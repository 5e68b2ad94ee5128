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


def seed_everything(seed: int = 0) -> None:
    """Seed Python's ``random``, NumPy and PyTorch (CPU and every CUDA device).

    Seeding makes a notebook's random numbers repeatable on one machine; the
    notebooks additionally print rounded numbers so that CPU and GPU agree.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed: got {seed!r} ({type(seed).__name__}), expected an int")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
