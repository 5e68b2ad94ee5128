"""Checker for the position-wise feed-forward network."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attention_course import ffn as ref

from ._compare import expect_close, expect_grad
from ._data import leaf, randn
from ._modules import backward_both, build_pair, compare_param_grads
from ._report import Report
from ._runner import Case, call_student, class_problem, run_cases, single_failure


def _ffn_mistakes(module, x: torch.Tensor):
    l1, l2 = module.linear1, module.linear2
    act = F.relu if module.activation == "relu" else F.gelu
    mistakes = [
        ("the activation is missing: FFN(x) = linear2(act(linear1(x)))", lambda: l2(l1(x))),
        (
            "you added a residual (x + FFN(x)): the residual connection belongs to the encoder "
            "layer, the FFN itself is linear2(act(linear1(x)))",
            lambda: x + l2(act(l1(x))),
        ),
        (
            "there is an activation after linear2 too: the output of the FFN is not activated",
            lambda: act(l2(act(l1(x)))),
        ),
    ]
    if module.activation == "gelu":
        mistakes += [
            (
                "the `activation` argument is ignored: activation='gelu' asks for F.gelu",
                lambda: l2(F.relu(l1(x))),
            ),
            (
                "you used the tanh approximation of GELU: use the exact F.gelu(x)",
                lambda: l2(F.gelu(l1(x), approximate="tanh")),
            ),
        ]
    else:
        mistakes.append(
            ("you used GELU: activation='relu' asks for F.relu", lambda: l2(F.gelu(l1(x))))
        )
    return mistakes


def _ffn_case(candidate, init: dict, x: torch.Tensor, grad: bool = False, train: bool = False):
    def run():
        student, reference = build_pair(candidate, ref.PositionwiseFeedForward, kwargs=init)
        student.train(train)
        reference.train(train)
        mine, theirs = (leaf(x), leaf(x)) if grad else (x, x)
        expected = reference(theirs)
        got = call_student(student, mine, what="ffn(x)", arg_names=("x",))
        with torch.no_grad():
            mistakes = _ffn_mistakes(reference, x)
        expect_close(got, expected, "the output", mistakes=mistakes)
        if grad:
            backward_both(got, expected)
            compare_param_grads(student, reference, "PositionwiseFeedForward")
            expect_grad(mine.grad, theirs.grad, "`x`")

    return run


def check_positionwise_feed_forward(candidate, *, timeout: float = 10.0) -> Report:
    """Check the class ``PositionwiseFeedForward(d_model, d_ff, dropout=0.0,
    activation="relu")``."""
    target = "positionwise_feed_forward"
    problem = class_problem(candidate, target, "PositionwiseFeedForward")
    if problem:
        return single_failure(target, "is an nn.Module class", problem)
    x = randn(2, 3, 8, seed=141)
    relu = {"d_model": 8, "d_ff": 16}
    cases = [
        Case("(B, T, D) input, relu", _ffn_case(candidate, relu, x)),
        Case("T = 1", _ffn_case(candidate, relu, x[:, :1])),
        Case(
            "2-D input (N, D)",
            _ffn_case(candidate, {"d_model": 6, "d_ff": 4}, randn(5, 6, seed=142)),
        ),
        Case(
            "activation='gelu'",
            _ffn_case(candidate, {"d_model": 8, "d_ff": 16, "activation": "gelu"}, x),
        ),
        Case(
            "dropout=0.5 is off in eval mode",
            _ffn_case(candidate, {"d_model": 8, "d_ff": 16, "dropout": 0.5}, x),
        ),
        Case(
            "gradients reach every parameter and x",
            _ffn_case(candidate, relu, x, grad=True, train=True),
        ),
    ]
    return run_cases(target, cases, timeout)
