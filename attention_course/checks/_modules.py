"""Build a student's module next to the reference one, with the same weights.

The student's class is constructed with the contract's arguments, then given
the reference's weights with ``load_state_dict``. Missing or unexpected names
become a failed case that lists the names the contract asks for; the one exception
is an extra *buffer* of the student's (a precomputed causal mask registered with
``register_buffer``), which the reference has no value for and is left as it is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from . import _data
from ._compare import expect_grad
from ._data import leaf
from ._runner import CaseFailed, call_student


def _call_args(args: tuple, kwargs: dict) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return ", ".join(parts)


def randomize_(module: nn.Module, seed: int) -> nn.Module:
    """Give every float parameter deterministic random values.

    Norm weights become ``1 + noise`` and biases small noise, so that mistakes
    such as swapping two norms or dropping a bias change the output.
    """
    generator = _data.generator(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float64)
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "bias":
                value = 0.1 * noise
            elif param.dim() <= 1 or "norm" in name:
                value = 1.0 + 0.2 * noise
            else:
                value = noise / math.sqrt(param.shape[-1])
            param.copy_(value.to(param.dtype))
    return module


def build_pair(
    candidate: type,
    reference_cls: type,
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    class_name: str | None = None,
) -> tuple[nn.Module, nn.Module]:
    """Construct (student, reference) with identical weights in ``dtype``."""
    kwargs = dict(kwargs or {})
    class_name = class_name or reference_cls.__name__
    what = f"{class_name}({_call_args(args, kwargs)})"
    reference = randomize_(reference_cls(*args, **kwargs), seed).to(dtype)
    student = call_student(candidate, *args, what=what, **kwargs)
    if not isinstance(student, nn.Module):
        raise CaseFailed(f"{what} did not build an nn.Module (got {type(student).__name__})")
    call_student(student.to, dtype, what=f"{what}.to({dtype})")
    load_reference_weights(student, reference, f"your {class_name}")
    return student, reference


def load_reference_weights(student: nn.Module, reference: nn.Module, what: str) -> None:
    """``student.load_state_dict(reference.state_dict())``, explained when it fails."""
    state = reference.state_dict()
    expected_names = list(state)
    try:
        own = student.state_dict()
    except Exception as error:  # noqa: BLE001 - student code may break state_dict
        raise CaseFailed(f"{what}.state_dict() raised {type(error).__name__}: {error}") from None
    try:
        own_buffers = {name for name, _ in student.named_buffers()}
    except Exception:  # noqa: BLE001 - student code may break named_buffers
        own_buffers = set()
    missing = [name for name in expected_names if name not in own]
    # An extra buffer (a precomputed mask, say) holds no weight of the contract: keep it.
    extra_buffers = [name for name in own if name not in state and name in own_buffers]
    unexpected = [name for name in own if name not in state and name not in own_buffers]
    if missing or unexpected:
        lines = [f"could not load the reference weights into {what}:"]
        if missing:
            lines.append("  missing: " + ", ".join(missing))
        if unexpected:
            lines.append("  unexpected: " + ", ".join(unexpected))
        lines.append(
            "The parameter and buffer names must be exactly: "
            + (", ".join(expected_names) if expected_names else "(none)")
        )
        lines.append(
            "Use the attribute names of the contract (an nn.Parameter or nn.Linear "
            "assigned to `self.<name>`; running statistics with `self.register_buffer`)."
        )
        raise CaseFailed("\n".join(lines))
    wrong_shapes = [
        f"{name}: yours {tuple(own[name].shape)}, expected {tuple(state[name].shape)}"
        for name in expected_names
        if tuple(own[name].shape) != tuple(state[name].shape)
    ]
    if wrong_shapes:
        raise CaseFailed(
            f"the parameters of {what} have the wrong shapes:\n  " + "\n  ".join(wrong_shapes)
        )
    try:
        student.load_state_dict(state, strict=not extra_buffers)
    except Exception as error:  # noqa: BLE001
        raise CaseFailed(
            f"{what}.load_state_dict(reference weights) raised {type(error).__name__}: {error}"
        ) from None


def compare_param_grads(student: nn.Module, reference: nn.Module, what: str) -> None:
    """Every parameter's gradient must exist and equal the reference's."""
    own = dict(student.named_parameters())
    for name, param in reference.named_parameters():
        mine = own.get(name)
        if mine is None:
            raise CaseFailed(f"{what} has no parameter `{name}`")
        expect_grad(mine.grad, param.grad, f"parameter `{name}`")


def backward_both(got: torch.Tensor, expected: torch.Tensor, seed: int = 123) -> None:
    """Backpropagate the same random upstream gradient through both outputs."""
    generator = _data.generator(seed)
    upstream = torch.randn(expected.shape, generator=generator, dtype=torch.float64).to(
        expected.dtype
    )
    expected.backward(upstream)
    if not got.requires_grad:
        raise CaseFailed(
            "the output does not require grad, so no gradient can flow back: do not use "
            "`torch.no_grad()`, `.detach()`, `.data` or `.numpy()` in the forward pass"
        )
    call_student(got.backward, upstream.to(got.dtype), what="backpropagating through your output")


def leaves(*inputs: torch.Tensor, grad: bool = True) -> tuple[tuple, tuple]:
    """(the student's inputs, the reference's): separate leaves that require grad when
    ``grad``, else the same tensors twice."""
    if not grad:
        return inputs, inputs
    return tuple(leaf(t) for t in inputs), tuple(leaf(t) for t in inputs)


def expect_same_grads(
    got: torch.Tensor,
    expected: torch.Tensor,
    inputs: dict[str, tuple[torch.Tensor, torch.Tensor]],
    modules: tuple[nn.Module, nn.Module] | None = None,
) -> None:
    """A gradient case's comparisons: backpropagate the same upstream gradient through
    both outputs, then compare the parameters' gradients of ``modules`` (student,
    reference) and, by name, each input's ``(student leaf, reference leaf)`` gradient."""
    backward_both(got, expected)
    if modules is not None:
        student, reference = modules
        compare_param_grads(student, reference, type(reference).__name__)
    for name, (mine, theirs) in inputs.items():
        expect_grad(mine.grad, theirs.grad, name)


class ModulePair:
    """The module-case sequence, written once: build the student's module beside the
    reference with the same weights (:func:`build_pair`), set both to training or eval
    mode, call both on the same inputs (:meth:`call`), compare gradients
    (:meth:`expect_grads`)."""

    def __init__(
        self,
        candidate: type,
        reference_cls: type,
        args: tuple = (),
        init: dict | None = None,
        *,
        train: bool | None = None,
    ) -> None:
        self.student, self.reference = build_pair(candidate, reference_cls, args, init)
        if train is not None:  # None keeps the mode a new module is in (training)
            self.student.train(train)
            self.reference.train(train)
        self.mine: tuple = ()
        self.theirs: tuple = ()

    def call(
        self,
        *inputs: torch.Tensor,
        what: str,
        arg_names: tuple[str, ...],
        grad: bool = False,
        error_hint: str | None = None,
        **options,
    ) -> tuple[object, object]:
        """(the student's result, the reference's) on the same inputs, as separate leaves
        when ``grad``. The reference gets every option; the student only those that are
        not None, so that a default argument is left to the student's own default."""
        self.mine, self.theirs = leaves(*inputs, grad=grad)
        expected = self.reference(*self.theirs, **options)
        given = {k: v for k, v in options.items() if v is not None}
        got = call_student(
            self.student,
            *self.mine,
            what=what,
            arg_names=arg_names,
            error_hint=error_hint,
            **given,
        )
        return got, expected

    def expect_grads(self, got: torch.Tensor, expected: torch.Tensor, names: Sequence[str]):
        """:func:`expect_same_grads` for the last :meth:`call`; ``names`` names its inputs."""
        inputs = dict(zip(names, zip(self.mine, self.theirs, strict=True), strict=True))
        expect_same_grads(got, expected, inputs, (self.student, self.reference))
