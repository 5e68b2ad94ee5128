"""Degenerate candidates: answers that do no real work but keep the output's shape and dtype.

For every checker (every task of every released exercise) this module builds a few
candidates from the checker's reference implementation (``buggy.REFERENCES``):

- ``zeros``, ``ones``: the reference's answer replaced by a constant of the same shape and
  dtype (for a bool mask: all False, all True);
- ``input``: the first tensor argument returned unchanged, where it has the answer's shape;
- ``transposed``: the reference's answer transposed on its last two axes, where that keeps
  the shape (a square last pair of axes);
- for the masks: the off-by-one variants (diagonal shifted by one; one position too many or
  too few masked).

Such a candidate must score exactly 0: see "Partial credit" in the README and
`attention_course.checks._report.Report.score`. The reference is called first, so the
candidate raises the reference's ValueError on a bad argument and keeps its shapes, device
and dtype: only the values are degenerate. ``tests/test_partial_credit.py`` runs them.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable

import torch


def _tensor_map(value, fn: Callable[[torch.Tensor], torch.Tensor]):
    """``fn`` applied to every floating/bool tensor of ``value`` (a tensor, tuple or list)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple):
        return tuple(_tensor_map(v, fn) for v in value)
    if isinstance(value, list):
        return [_tensor_map(v, fn) for v in value]
    return value


def zeros(t: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(t)


def ones(t: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(t)


def transposed(t: torch.Tensor) -> torch.Tensor:
    if t.dim() < 2 or t.shape[-1] != t.shape[-2]:
        return t  # the reference's own object: this call is not degenerate
    return t.transpose(-2, -1).clone()


def _first_tensor(args, kwargs):
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None


def _as_input(out, args, kwargs):
    x = _first_tensor(args, kwargs)
    if (
        isinstance(out, torch.Tensor)
        and x is not None
        and x.shape == out.shape
        and x.dtype == out.dtype
        and x.device == out.device
    ):
        return x.clone()
    return out


def _differs(a, b) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.device.type == "meta" or b.device.type == "meta":
            return False
        return a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) != len(b) or any(_differs(x, y) for x, y in zip(a, b))
    return a is not b and a != b


class Tally:
    """How many calls a candidate answered differently from the reference: a candidate that
    never did is the reference itself on the checker's inputs, not a degenerate answer."""

    def __init__(self) -> None:
        self.calls = 0
        self.changed = 0
        self.kept = 0  # calls whose answer was degenerate (not left as the reference's)

    def record(self, out, new):
        self.calls += 1
        self.changed += bool(_differs(out, new))
        self.kept += new is not out and not _partly_same(out, new)
        return new

    @property
    def every_call(self) -> bool:
        """True when every call of the check got a degenerate answer (not the reference's
        answer left as it was because the transform did not apply, e.g. a non-square
        answer for ``transposed``)."""
        return self.calls > 0 and self.kept == self.calls


def _partly_same(out, new) -> bool:
    """True when some tensor of a tuple answer is the reference's own object."""
    if isinstance(out, (tuple, list)) and isinstance(new, (tuple, list)):
        return any(isinstance(a, torch.Tensor) and a is b for a, b in zip(out, new)) or any(
            _partly_same(a, b) for a, b in zip(out, new)
        )
    return False


def function_candidate(reference: Callable, transform: Callable, name: str) -> Callable:
    """A function with the reference's signature: the reference's answer, transformed.
    ``transform(out, args, kwargs)``."""
    tally = Tally()

    @functools.wraps(reference)
    def candidate(*args, **kwargs):
        out = reference(*args, **kwargs)
        return tally.record(out, transform(out, args, kwargs))

    candidate.__name__ = candidate.__qualname__ = getattr(reference, "__name__", name)
    candidate.degenerate = name
    candidate.tally = tally
    return candidate


def class_candidate(reference: type, transform: Callable, name: str) -> type:
    """A subclass of the reference whose forward transforms the reference's answer (the
    parameters, the constructor and the signature of forward stay the reference's). The
    reference runs on a copy of the module, so the candidate updates no buffer either."""
    base_forward = reference.forward
    tally = Tally()

    @functools.wraps(base_forward)
    def forward(self, *args, **kwargs):
        # on a copy: a degenerate answer leaves no trace either (no running statistics)
        out = base_forward(copy.deepcopy(self), *args, **kwargs)
        return tally.record(out, transform(out, args, kwargs))

    cls = type(
        reference.__name__,
        (reference,),
        {"forward": forward, "degenerate": name, "tally": tally},
    )
    cls.__qualname__ = reference.__qualname__
    cls.__module__ = reference.__module__
    forward.__signature__ = inspect.signature(base_forward)
    return cls


def _elementwise(fn):
    return lambda out, args, kwargs: _tensor_map(out, fn)


GENERIC: dict[str, Callable] = {
    "zeros": _elementwise(zeros),
    "ones": _elementwise(ones),
    "input": _as_input,
    "transposed": _elementwise(transposed),
}


def make(reference, transform: Callable, name: str):
    if isinstance(reference, type):
        return class_candidate(reference, transform, name)
    return function_candidate(reference, transform, name)


# ---------------------------------------------------------------- masks, off by one


def _causal_shift(shift: int):
    def candidate(size, device=None, *, S=None):
        from attention_course import masking

        m = masking.causal_mask(size, device, S=S)  # validation, shape, device
        S_ = size if S is None else S
        ones_ = torch.ones(size, S_, dtype=torch.bool, device=device)
        return ones_.tril(diagonal=S_ - size + shift) if m.device.type != "meta" else m

    return candidate


def _padding_shift(shift: int):
    def candidate(lengths, max_len=None):
        from attention_course import masking

        m = masking.padding_mask(lengths, max_len)  # validation, shape, device
        if m.device.type == "meta":
            return m
        lengths_t = torch.as_tensor(lengths, device=m.device)
        positions = torch.arange(m.shape[-1], device=m.device)
        return positions[None, :] < (lengths_t[:, None] + shift)

    return candidate


def _sliding_shift(shift: int):
    from attention_course import kv

    @functools.wraps(kv.sliding_window_mask)
    def candidate(*args, **kwargs):
        bound = inspect.signature(kv.sliding_window_mask).bind(*args, **kwargs)
        bound.apply_defaults()
        m = kv.sliding_window_mask(*args, **kwargs)
        if m.device.type == "meta":
            return m
        params = dict(bound.arguments)
        params["window"] = params["window"] + shift
        if params["window"] < 1:
            return torch.zeros_like(m)
        return kv.sliding_window_mask(**params)

    return candidate


def mask_variants() -> dict[str, dict[str, Callable]]:
    """The off-by-one variants of the mask targets, by target."""
    return {
        "causal_mask": {"diagonal-1": _causal_shift(-1), "diagonal+1": _causal_shift(1)},
        "padding_mask": {"one-too-many": _padding_shift(-1), "one-too-few": _padding_shift(1)},
        "sliding_window_mask": {"window-1": _sliding_shift(-1), "window+1": _sliding_shift(1)},
    }


# ---------------------------------------------------------------- per checker


def _constant_head(layer: int, head: int):
    def find_induction_head(model, ids, period):
        return layer, head

    return find_induction_head


def _constant_effect(value: float):
    def ablation_effect(model, ids, period, layer, head):
        return value

    return ablation_effect


def _swapped_head():
    from attention_course import interpret

    def find_induction_head(model, ids, period):
        layer, head = interpret.find_induction_head(model, ids, period)
        return head, layer

    return find_induction_head


NOT_TENSOR = frozenset({"find_induction_head", "ablation_effect"})
"""Targets whose answer is not a tensor: the generic candidates do not apply."""


def per_checker() -> dict[str, dict[str, Callable]]:
    """Degenerate answers of the targets whose answer is not a tensor: a fixed guess (every
    (layer, head) of chapter 17's model, the trained model's induction head among them),
    and (head, layer) for (layer, head)."""
    return {
        "find_induction_head": {
            **{
                f"always ({layer}, {head})": _constant_head(layer, head)
                for layer in range(2)
                for head in range(4)
            },
            "(head, layer)": _swapped_head(),
        },
        "ablation_effect": {
            "always 0.0": _constant_effect(0.0),
            "always 1.0": _constant_effect(1.0),
        },
    }


def candidates(target: str, reference) -> dict[str, Callable]:
    """Every degenerate candidate of ``target``, by name (generic ones are built afresh)."""
    found = {}
    if target not in NOT_TENSOR:
        found = {name: make(reference, transform, name) for name, transform in GENERIC.items()}
    found.update(mask_variants().get(target, {}))
    found.update(per_checker().get(target, {}))
    return found
