"""Record the largest tensor that student code creates while a call runs.

A checker that must know *how* a result was computed, not only what it is (exercise
12: tiled attention never holds the ``T x S`` scores), wraps the call in
:func:`record_sizes`. A ``TorchDispatchMode`` sees every operation PyTorch runs below
Python, composite functions such as ``einsum`` or ``softmax`` taken apart, and notes
the storage of each tensor it returns (a view of an existing tensor, such as an
``expand``, allocates nothing and counts only its own storage). The verdict depends on
the sizes the code asks for, never on the machine, its allocator or the time taken.

Under the grader the call runs in the student's kernel: the sandbox's client sees an
active recorder (:func:`active`), asks the kernel to record during the call
(:class:`LargestTensor` there too), and hands the kernel's report back
(:func:`note`). Recorders are per thread, as dispatch modes are, so two submissions
graded at once (``--jobs``) never mix.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

_LOCAL = threading.local()


@dataclass
class Largest:
    """The largest tensor seen: its number of elements, shape, dtype and the operation."""

    elements: int = 0
    shape: tuple[int, ...] = ()
    dtype: str = ""
    op: str = ""

    def merge(self, elements: int, shape, dtype: str, op: str) -> None:
        if elements > self.elements:
            self.elements, self.shape, self.dtype, self.op = (
                int(elements),
                tuple(int(s) for s in shape),
                str(dtype),
                str(op),
            )

    def as_wire(self) -> tuple:
        return (self.elements, tuple(self.shape), self.dtype, self.op)


def _elements(t: torch.Tensor) -> int:
    """The elements of ``t``'s storage: what was allocated for it (a view: its base's)."""
    try:
        return t.untyped_storage().nbytes() // max(t.element_size(), 1)
    except Exception:  # noqa: BLE001 - a tensor without storage (a subclass): its own size
        return t.numel()


class LargestTensor(TorchDispatchMode):
    """A dispatch mode that keeps the largest tensor returned by any operation."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = Largest()

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # PyTorch wraps a mode's __torch_dispatch__ in torch._dynamo.disable unless this
        # says no; that imports torch._dynamo on the first call (seconds on a small CPU,
        # inside a case's time limit). Nothing here is ever compiled.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            # Numbers and masks only: the generator's state (uint8) and index tensors are
            # bookkeeping, and the grader's own reads of the random state would count.
            if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.dtype == torch.bool):
                name = getattr(getattr(func, "overloadpacket", None), "__name__", str(func))
                self.largest.merge(_elements(t), t.shape, str(t.dtype), f"aten.{name}")
        return out


def active() -> bool:
    """True while this thread runs inside :func:`record_sizes` (the sandbox asks)."""
    return bool(getattr(_LOCAL, "stack", None))


def note(elements: int, shape, dtype: str, op: str) -> None:
    """Add a size recorded elsewhere (the student's kernel) to this thread's recorders."""
    for largest in getattr(_LOCAL, "stack", ()):
        largest.merge(elements, shape, dtype, op)


@contextlib.contextmanager
def record_sizes():
    """``with record_sizes() as largest: call_student(...)``; then ``largest.elements``
    is the size of the largest tensor created in the block, here or in the kernel."""
    largest = Largest()
    stack = getattr(_LOCAL, "stack", None)
    if stack is None:
        stack = _LOCAL.stack = []
    stack.append(largest)
    mode = LargestTensor()
    try:
        with mode:
            yield largest
    finally:
        stack.remove(largest)
        largest.merge(*mode.largest.as_wire())
