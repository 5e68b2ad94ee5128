"""A tensor that notes each indexed write whose index repeats.

Exercise 15's check (`attention_course.checks.rolling_cache`) passes the buffer and
``slot_positions`` as :class:`WriteWatch` tensors: ordinary tensors, except that an indexed
write (``x[idx] = v``, ``index_put_``, ``index_copy_``) whose indices repeat is noted in
:attr:`WriteWatch.repeated` (which value lands is undefined in PyTorch, so the check refuses
it). In a grading kernel the tensors cross by value, so the grader marks the arguments that
are watched and the kernel side (`attention_course.grading.sandbox`) wraps them in this same
class and sends back what it noted: the check then sees what it sees in-process.
"""

from __future__ import annotations

import torch


class WriteWatch(torch.Tensor):
    """An ordinary tensor that notes each indexed write whose index repeats (the repeated
    indices, one list per write, in :attr:`repeated`)."""

    repeated: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if args and isinstance(args[0], WriteWatch):
            repeated = repeated_write(func, args, kwargs)
            if repeated is not None:
                WriteWatch.repeated.append(repeated)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def repeated_write(func, args, kwargs) -> list | None:
    """The repeated indices of an indexed write (``x[idx] = v``, ``index_put_``,
    ``index_copy_``), or None."""
    if func is torch.Tensor.__setitem__:
        key = args[1] if isinstance(args[1], tuple) else (args[1],)
    elif func in (torch.Tensor.index_put_, torch.index_put_):
        accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
        if accumulate:
            return None
        key = tuple(args[1])
    elif func is torch.Tensor.index_copy_:
        key = (args[2],)
    else:
        return None
    indices = []
    for k in key:
        if isinstance(k, (list, tuple)) and k and all(isinstance(i, int) for i in k):
            k = torch.tensor(k)
        if isinstance(k, torch.Tensor) and k.dim() >= 1 and not k.dtype.is_floating_point:
            if k.dtype != torch.bool:
                with torch._C.DisableTorchFunctionSubclass():
                    indices.append(k.detach().cpu().long())
    if not indices:
        return None
    try:
        flat = torch.stack([i.reshape(-1) for i in torch.broadcast_tensors(*indices)], dim=1)
    except RuntimeError:
        return None
    rows, counts = flat.unique(dim=0, return_counts=True)
    if bool((counts > 1).any()):
        return rows[counts > 1].flatten().tolist()
    return None
