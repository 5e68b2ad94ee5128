"""Checker for the position-wise feed-forward network."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attention_course import ffn as ref

from ._compare import expect_close, expect_like
from ._data import randn
from ._dropout import expect_dropout_of, is_unchanged, looks_dropped_out
from ._modules import ModulePair, build_pair
from ._runner import TRIVIAL, Case, CaseFailed, call_student, checker

_FFN_DROPOUT_WHERE = (
    "on the hidden activations, between the activation and linear2: "
    "linear2(dropout(act(linear1(x))))"
)


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
        pair = ModulePair(candidate, ref.PositionwiseFeedForward, init=init, train=train)
        reference = pair.reference
        seen: list = []
        linear2 = getattr(pair.student, "linear2", None)
        handle = None
        if isinstance(linear2, torch.nn.Module):
            handle = linear2.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
        try:
            got, expected = pair.call(x, what="ffn(x)", arg_names=("x",), grad=grad)
        finally:
            if handle is not None:
                handle.remove()
        p = init.get("dropout", 0.0)
        # A diagnosis only, once the values are wrong: the hook sees the input of linear2
        # when the forward calls the module (an einsum forward is checked all the same).
        wrong = isinstance(got, torch.Tensor) and not (
            got.shape == expected.shape and is_unchanged(got, expected)
        )
        if not train and p > 0 and wrong:
            act = F.relu if init.get("activation", "relu") == "relu" else F.gelu
            with torch.no_grad():
                clean_hidden = act(reference.linear1(x))
            hidden = seen[0] if seen and isinstance(seen[0], torch.Tensor) else None
            if (hidden is not None and looks_dropped_out(hidden, clean_hidden, p)) or (
                looks_dropped_out(got, expected, p)
            ):
                raise CaseFailed(
                    f"dropout is active in eval mode (module.eval()): entries are zeroed and "
                    f"the rest scaled by 1 / (1 - {p:g}); use the module `self.dropout = "
                    "nn.Dropout(dropout)`, which follows train()/eval(), or "
                    "`F.dropout(h, p, training=self.training)`, not `training=True`"
                )
        with torch.no_grad():
            mistakes = _ffn_mistakes(reference, x)
        expect_close(got, expected, "the output", mistakes=mistakes)
        if grad:
            pair.expect_grads(got, expected, ("`x`",))

    return run


def _hidden_from_output(out: torch.Tensor, linear2: torch.nn.Linear) -> torch.Tensor:
    """The hidden activations h with ``linear2(h) = out``, by least squares: with
    d_ff <= d_model and a random weight, linear2 is one-to-one, so h is read back from the
    output itself, whatever the forward calls (the modules, or einsum on their weights)."""
    weight, bias = linear2.weight.detach(), linear2.bias.detach()  # (D, F), (D,)
    rhs = (out.detach().to(weight.dtype) - bias).reshape(-1, weight.shape[0]).T  # (D, N)
    hidden = torch.linalg.lstsq(weight, rhs).solution.T  # (N, F)
    return hidden.reshape(*out.shape[:-1], weight.shape[1])


def _ffn_dropout_case(candidate, init: dict, x: torch.Tensor):
    """Training mode with dropout, checked by its properties: the input of linear2 is the
    clean hidden activation, dropped out and rescaled; nothing happens after linear2. The
    input of linear2 is read back from the output (``d_ff <= d_model``), so no hook on
    ``self.linear2`` is needed."""
    p = init["dropout"]
    if init["d_ff"] > init["d_model"]:
        raise ValueError("the hidden activations can be read back only when d_ff <= d_model")

    def run():
        student, reference = build_pair(candidate, ref.PositionwiseFeedForward, kwargs=init)
        reference.eval()
        act = F.relu if init.get("activation", "relu") == "relu" else F.gelu
        with torch.no_grad():
            clean_hidden = act(reference.linear1(x))  # (B, T, F)
            clean_out = reference(x)
        student.train()
        got = call_student(student, x, what="ffn(x) in training mode", arg_names=("x",))
        expect_like(got, clean_out, "the output")
        if is_unchanged(got, clean_out):
            raise CaseFailed(
                f"the `dropout` argument is ignored: in training mode with dropout={p:g} "
                f"about {p:.0%} of the hidden activations must be set to 0 (nn.Dropout("
                f"dropout), not nn.Dropout(0.0)); dropout goes {_FFN_DROPOUT_WHERE}"
            )
        if looks_dropped_out(got, clean_out, p):
            raise CaseFailed(
                f"dropout is applied after linear2 (to the output): it belongs {_FFN_DROPOUT_WHERE}"
            )
        hidden = _hidden_from_output(got, reference.linear2)
        with torch.no_grad():
            expected = reference.linear2(hidden)
        expect_close(
            got,
            expected,
            "the output (linear2 of the hidden activations read back from it)",
            hints=[lambda _: "nothing may happen after linear2: no second dropout, no activation"],
        )
        expect_dropout_of(
            hidden,
            clean_hidden,
            p,
            "the input of linear2 (the hidden activations)",
            ignored="the hidden activations are not dropped out",
            where=_FFN_DROPOUT_WHERE,
        )

    return run


@checker("positionwise_feed_forward", "PositionwiseFeedForward")
def check_positionwise_feed_forward(candidate) -> list[Case]:
    """Check the class ``PositionwiseFeedForward(d_model, d_ff, dropout=0.0,
    activation="relu")``."""
    x = randn(2, 3, 8, seed=141)
    relu = {"d_model": 8, "d_ff": 16}
    big = randn(8, 16, 16, seed=143)  # d_ff = 12 <= d_model = 16: see _ffn_dropout_case
    return [
        Case("(B, T, D) input, relu", _ffn_case(candidate, relu, x)),
        Case("T = 1", _ffn_case(candidate, relu, x[:, :1]), weight=TRIVIAL),
        Case(
            "2-D input (N, D)",
            _ffn_case(candidate, {"d_model": 6, "d_ff": 4}, randn(5, 6, seed=142)),
        ),
        Case(
            "activation='gelu'",
            _ffn_case(candidate, {"d_model": 8, "d_ff": 16, "activation": "gelu"}, x),
            covers=frozenset({"activation"}),
        ),
        Case(
            "dropout=0.5 is off in eval mode",
            _ffn_case(candidate, {"d_model": 8, "d_ff": 16, "dropout": 0.5}, x),
            covers=frozenset({"dropout", "mode=eval"}),
        ),
        Case(
            "training mode, dropout=0.3: the hidden activations are dropped out",
            _ffn_dropout_case(candidate, {"d_model": 16, "d_ff": 12, "dropout": 0.3}, big),
            covers=frozenset({"dropout", "mode=train", "dropout>0 in training"}),
        ),
        Case(
            "training mode, dropout=0.5, activation='gelu'",
            _ffn_dropout_case(
                candidate, {"d_model": 16, "d_ff": 12, "dropout": 0.5, "activation": "gelu"}, big
            ),
            covers=frozenset({"dropout", "mode=train", "dropout>0 in training", "activation"}),
        ),
        Case(
            "gradients reach every parameter and x",
            _ffn_case(candidate, relu, x, grad=True, train=True),
            covers=frozenset({"grad", "mode=train"}),
        ),
    ]
