"""Reading what a student's answer function returned: plain values, shown briefly."""

from __future__ import annotations

import torch


def plain(answer: object) -> object:
    """``answer`` as plain Python values: no numpy or torch types left.

    0-d and one-element tensors or arrays, and numpy/torch scalars, become ``int``,
    ``float`` or ``bool``; other tensors, arrays, lists and ``torch.Size`` become tuples
    (nested for more than one axis). Strings and everything else are returned as they are.
    """
    if isinstance(answer, torch.Tensor):
        answer = answer.detach().cpu()
        return answer.item() if answer.numel() == 1 else plain(answer.tolist())
    if type(answer).__module__ == "numpy" and hasattr(answer, "tolist"):
        # np.generic (np.int64, np.float32, np.bool_) and np.ndarray, without importing numpy
        size = getattr(answer, "size", 1)
        return plain(answer.reshape(-1)[0].item() if size == 1 else answer.tolist())
    if isinstance(answer, (torch.Size, tuple, list)):
        return tuple(plain(v) for v in answer)
    return answer


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def show(value: object, limit: int = 80) -> str:
    """A short, stable text for an answer: ``(2, 4, 9, 7)``, ``"e"``, ``0.9999``."""
    text = _show(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _show(value: object) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value) if abs(value) < 10**60 else "a very large int"
    if isinstance(value, float):
        if value.is_integer():
            return str(int(value))
        # six digits, unless they would hide the fraction of a large number (6881280.5)
        return f"{value:.6g}" if abs(value) < 1e5 else f"{value:.15g}"
    if isinstance(value, tuple):
        inner = ", ".join(_show(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return f"a {type(value).__name__}"


def kind(value: object) -> str:
    """What kind of value ``value`` is, in words (for wrong-kind messages)."""
    if isinstance(value, str):
        return f"the text {show(value)}"
    if isinstance(value, bool):
        return f"the bool {value}"
    if is_number(value):
        return f"the number {show(value)}"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}, {show(value)}"
    return f"a {type(value).__name__}"


def answer_name(candidate: object) -> str:
    """The name of the student's answer function, for messages: ``chosen_beta``."""
    return getattr(candidate, "__name__", "your answer")
