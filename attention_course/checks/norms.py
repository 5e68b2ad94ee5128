"""Checkers for normalisation: ``LayerNorm`` and ``BatchNorm1d``."""

from __future__ import annotations

import torch

from attention_course import norms as ref

from . import _data
from ._compare import expect_close, match_tolerances, matches
from ._data import randn
from ._modules import ModulePair, build_pair
from ._runner import TRIVIAL, Case, CaseFailed, call_student, checker, without_builtin

# ---------------------------------------------------------------- LayerNorm

_UNBIASED = (
    "you used the unbiased variance (divides by N-1, the default of torch.var/torch.std): "
    "normalisation uses the biased variance, `x.var(dim, unbiased=False)` or "
    "`((x - mean) ** 2).mean(dim)`"
)
_EPS_OUTSIDE = (
    "eps is outside the square root: compute (x - mean) / sqrt(var + eps), not "
    "(x - mean) / (std + eps)"
)


def _layer_norm(x, dims, weight, bias, eps, *, unbiased=False, eps_outside=False, eps_used=None):
    eps = eps if eps_used is None else eps_used
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, keepdim=True, unbiased=unbiased)
    if eps_outside:
        y = (x - mean) / (var.sqrt() + eps)
    else:
        y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight + bias
    return y


def _rows_variance_layer_norm(x, dims, weight, bias, eps):
    """LayerNorm over ``dims`` whose variance is the mean of the last axis's variances."""
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=-1, keepdim=True, unbiased=False).mean(dim=dims, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps)
    return y if weight is None else y * weight + bias


def _layer_norm_mistakes(module, x: torch.Tensor):
    n = len(module.normalized_shape)
    dims = tuple(range(-n, 0))
    w, b, eps = module.weight, module.bias, module.eps

    def ln(**kwargs):
        return lambda: _layer_norm(x, dims, w, b, eps, **kwargs)

    mistakes = [
        (_UNBIASED, ln(unbiased=True)),
        (_EPS_OUTSIDE, ln(eps_outside=True)),
        (
            f"the `eps` argument is ignored (you used 1e-5, this case uses eps={eps:g})",
            ln(eps_used=1e-5),
        ),
        ("eps is missing: add it to the variance inside the square root", ln(eps_used=0.0)),
    ]
    if n > 1:
        mistakes.append(
            (
                f"you normalised over the last axis only: normalized_shape="
                f"{tuple(module.normalized_shape)} means mean and variance over the last {n} axes",
                lambda: _layer_norm(
                    x,
                    (-1,),
                    w,
                    b,
                    eps,
                ),
            )
        )
        mistakes.append(
            (
                "your variance is the mean of each row's variance (about the row's own mean), "
                "not the variance of all the numbers of the last "
                f"{n} axes about their one mean: take `x.var(dim=dims, unbiased=False)` over "
                "all of them at once",
                lambda: _rows_variance_layer_norm(x, dims, w, b, eps),
            )
        )
    mistakes += _wrong_axis_mistakes(x, n, w, b, eps)
    if w is not None:
        mistakes += [
            (
                "`weight` and `bias` are not applied: finish with y * self.weight + self.bias",
                lambda: _layer_norm(x, dims, None, None, eps),
            ),
            (
                "`weight` and `bias` are swapped: y * weight + bias",
                lambda: _layer_norm(x, dims, b, w, eps),
            ),
        ]
    return mistakes


def _wrong_axis_mistakes(x: torch.Tensor, n: int, w, b, eps):
    """Normalising over one axis before the ``n`` normalised ones, each named for what it
    is: dim 0 of a (B, T, D) input is the batch (what BatchNorm does), dim 1 = -2 the
    tokens. On a 2-D (N, D) input dim 0 is also dim -2: the two mistakes give the same
    output, and the message names both instead of calling a read of dim=-2 BatchNorm
    (found by a simulated student: the grader's summary of a class said "that is
    BatchNorm" for a LayerNorm over the token axis, from this case alone)."""
    mistakes = []
    for axis in range(x.dim() - n):
        from_end = axis - x.dim()
        if axis == 0 and x.dim() == 2:
            why = (
                "you normalised over dim 0 of this (N, D) input (dim=0, which is also dim=-2 "
                "here): LayerNorm normalises each row over its last axis; on a (B, T, D) "
                "input dim=0 would be the batch and dim=-2 the tokens, and another case tells "
                "them apart"
            )
        elif axis == 0:
            why = (
                "you normalised over the batch axis (dim=0): that is BatchNorm; LayerNorm "
                "normalises each sample over its last axes"
            )
        else:
            why = (
                f"you normalised over dim={axis} (= dim={from_end}, the tokens of a (B, T, D) "
                "input), not over the features: LayerNorm takes the mean and variance over "
                "the last len(normalized_shape) axes, `dims = tuple(range(-len("
                "normalized_shape), 0))`"
            )
        mistakes.append((why, lambda axis=axis: _layer_norm(x, (axis,), w, b, eps)))
    return mistakes


def _layer_norm_case(candidate, init: dict, x: torch.Tensor, grad: bool = False):
    def run():
        pair = ModulePair(candidate, ref.LayerNorm, init=init)
        got, expected = pair.call(x, what="norm(x)", arg_names=("x",), grad=grad)
        with torch.no_grad():
            mistakes = _layer_norm_mistakes(pair.reference, x)
        expect_close(got, expected, "the output", mistakes=mistakes)
        if grad:
            try:
                pair.expect_grads(got, expected, ("`x`",))
            except CaseFailed as failure:
                if _stats_without_grad(pair, x, expected):
                    raise CaseFailed(f"{failure}\nLikely mistake: {_LN_STATS_NO_GRAD}.") from None
                raise

    return run


_LN_STATS_NO_GRAD = (
    "the mean and variance are computed under `torch.no_grad()` (or detached): the output is "
    "right, but the gradient of x misses the terms that flow through the mean and the "
    "variance; compute them with ordinary tensor operations, outside torch.no_grad(), "
    "without .detach()"
)


def _stats_without_grad(pair: ModulePair, x: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether the student's gradient of x is the one LayerNorm gives when its mean and
    variance are constants (computed under ``torch.no_grad()``)."""
    got_grad = pair.mine[0].grad if pair.mine else None
    if got_grad is None:
        return False
    module = pair.reference
    dims = tuple(range(-len(module.normalized_shape), 0))
    generator = _data.generator(123)  # backward_both's upstream gradient
    upstream = torch.randn(expected.shape, generator=generator, dtype=torch.float64)
    for mean_constant, var_constant in ((True, True), (True, False), (False, True)):
        leaf = x.detach().clone().requires_grad_(True)
        mean = leaf.mean(dim=dims, keepdim=True)
        var = leaf.var(dim=dims, keepdim=True, unbiased=False)
        mean = mean.detach() if mean_constant else mean
        var = var.detach() if var_constant else var
        y = (leaf - mean) / torch.sqrt(var + module.eps)
        if module.weight is not None:
            y = y * module.weight.detach() + module.bias.detach()
        y.backward(upstream.to(y.dtype))
        if matches(got_grad.detach().cpu(), leaf.grad, *match_tolerances(leaf.grad.dtype)):
            return True
    return False


def _layer_norm_state(candidate):
    def run():
        student, _ = build_pair(candidate, ref.LayerNorm, kwargs={"normalized_shape": (3, 4)})
        for name in ("weight", "bias"):
            param = getattr(student, name, None)
            if not isinstance(param, torch.nn.Parameter):
                raise CaseFailed(f"`{name}` should be an nn.Parameter of shape (3, 4)")
            if tuple(param.shape) != (3, 4):
                raise CaseFailed(
                    f"`{name}` has shape {tuple(param.shape)}, expected normalized_shape (3, 4)"
                )

    return run


def _with_std(x: torch.Tensor, std: list[float]) -> torch.Tensor:
    """``x`` with each row (last axis) shifted to mean 0 and scaled to the (biased)
    standard deviation ``std[i]``."""
    rows = x.reshape(-1, x.shape[-1])
    rows = rows - rows.mean(-1, keepdim=True)
    rows = rows / rows.pow(2).mean(-1, keepdim=True).sqrt()
    return (rows * torch.tensor(std, dtype=x.dtype)[:, None]).reshape(x.shape)


@checker(
    "layer_norm",
    "LayerNorm",
    answer_builtins=(
        "torch.nn.LayerNorm",
        "torch.nn.functional.layer_norm",
        "torch.layer_norm",
        "torch.native_layer_norm",
    ),
)
def check_layer_norm(candidate) -> list[Case]:
    """Check the class ``LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True)``."""
    # six rows of mean 2 whose standard deviations are fixed (0.3 .. 5), only their shapes
    # drawn: the first row's variance, 0.09, makes eps outside the square root (a relative
    # error of eps / (2 var)) large enough to be named, under every seed
    x = 2.0 + _with_std(randn(2, 3, 8, seed=101), [0.3, 1.0, 2.0, 3.0, 4.0, 5.0])
    tiny = 5.0 + 1e-3 * randn(2, 3, 8, seed=102)  # variance 1e-6, below eps = 1e-5
    # for normalized_shape=(T, D): rows of different means, so that the variance over all
    # T * D numbers is not the mean of the rows' variances (nor the last axis's alone)
    shifted = x + torch.tensor([[-3.0, 0.5, 4.0], [2.0, -1.5, 6.0]], dtype=x.dtype)[..., None]
    cases = [
        Case(
            "parameters shaped like normalized_shape",
            _layer_norm_state(candidate),
            weight=TRIVIAL,
            support=True,
        ),
        Case(
            "(B, T, D) input, normalized_shape=D (an int)",
            _layer_norm_case(candidate, {"normalized_shape": 8}, x),
        ),
        Case(
            "multi-axis normalized_shape=(T, D)",
            _layer_norm_case(candidate, {"normalized_shape": (3, 8)}, shifted),
            covers=frozenset({"normalized_shape=tuple"}),
        ),
        Case(
            "2-D input (N, D), normalized_shape=[D]",
            _layer_norm_case(candidate, {"normalized_shape": [6]}, randn(5, 6, seed=103)),
            covers=frozenset({"normalized_shape=list"}),
        ),
        Case(
            "tiny-variance input (variance below eps)",
            _layer_norm_case(candidate, {"normalized_shape": 8}, tiny),
        ),
        Case(
            "eps=1e-2 on a small-variance input",
            _layer_norm_case(
                candidate, {"normalized_shape": 8, "eps": 1e-2}, 0.1 * randn(2, 3, 8, seed=104)
            ),
            covers=frozenset({"eps"}),
        ),
        Case(
            "elementwise_affine=False (no parameters)",
            _layer_norm_case(candidate, {"normalized_shape": 8, "elementwise_affine": False}, x),
            covers=frozenset({"elementwise_affine"}),
        ),
        Case(
            "gradients reach weight, bias and x",
            _layer_norm_case(candidate, {"normalized_shape": (3, 8)}, shifted, grad=True),
            covers=frozenset({"grad", "normalized_shape=tuple"}),
        ),
    ]
    return without_builtin(cases, "layer_norm", "LayerNorm")


# ---------------------------------------------------------------- BatchNorm1d

_BN_UNBIASED = (
    "you normalised with the unbiased variance (N-1): in training BatchNorm normalises with "
    "the biased batch variance (divide by N); only running_var uses the unbiased one"
)
_BN_RUNNING_BIASED = (
    "running_var was updated with the biased variance: like nn.BatchNorm1d, update it with the "
    "unbiased batch variance (multiply by N / (N - 1))"
)
_BN_MOMENTUM_SWAPPED = (
    "momentum is used the wrong way round: running = (1 - momentum) * running + momentum * "
    "batch_statistic (with momentum=0.1 the new batch gets weight 0.1, not 0.9)"
)
_BN_EVAL_BATCH = (
    "eval mode still uses the batch statistics: in eval (self.training is False) normalise "
    "with running_mean and running_var"
)
_BN_NO_UPDATE = (
    "the running statistics stay at their initial values (running_mean 0, running_var 1): "
    "in training, update running_mean and running_var in place (under torch.no_grad())"
)
_BN_TRAIN_RUNNING = (
    "in training mode the output is normalised with the running statistics: training "
    "normalises each batch with its own mean and biased variance; running_mean and "
    "running_var are for eval mode"
)
_BN_EVAL_UPDATES = (
    "the running statistics are updated in eval mode too (with the eval batch): update them "
    "only when self.training is True"
)
_BN_CUMULATIVE = (
    "the running statistics are a cumulative average of all the batches (what momentum=None "
    "does): with a momentum, running = (1 - momentum) * running + momentum * batch_stat"
)
_BN_3D_DIMS = (
    "for a 3-D input (B, C, L) the statistics must be taken over the batch AND length axes, "
    "dims (0, 2): one mean and variance per channel"
)
_BN_3D_DIMS_01 = (
    "for a 3-D input (B, C, L) the statistics are taken over dims (0, 1), batch and "
    "channels, which gives one mean per position: take them over dims (0, 2), batch and "
    "length, one per channel, and reshape them to (1, C, 1)"
)
_BN_EPS_OUTSIDE = _EPS_OUTSIDE
_BN_WRONG_N = (
    "running_var's correction N / (N - 1) used N = B, the batch size: for a (B, C, L) input "
    "each channel's statistics are taken over N = B·L values, so the factor is "
    "B·L / (B·L - 1)"
)
_BN_BROADCAST = (
    "a per-channel tensor of shape (C,) lines up with the LAST axis of x, which for a "
    "(B, C, L) input is L, not the channels: reshape the mean, variance, weight and bias to "
    "(1, C, 1) before combining them with x"
)


def _bn_error_hint(three_d: bool):
    """The hint for an exception raised by the student's BatchNorm."""

    def hint(error_text: str) -> str | None:
        if not three_d:
            return None
        if "must match the size" in error_text and "dimension 2" in error_text:
            return _BN_BROADCAST  # x (B, C, L) met a (C,) tensor: L against C on the last axis
        return _BN_3D_DIMS

    return hint


def _simulate_batch_norm(
    weight,
    bias,
    steps,
    eval_x,
    momentum,
    eps,
    *,
    unbiased_norm=False,
    running_biased=False,
    momentum_swapped=False,
    eval_batch=False,
    no_update=False,
    dims_3d=(0, 2),
    eps_outside=False,
    n_batch_only=False,
    running_in_training=False,
    eval_updates=False,
    cumulative=False,
    momentum_used=None,
    eps_used=None,
):
    """A from-scratch BatchNorm with switchable mistakes: outputs and running stats.
    ``momentum_used``/``eps_used``: the value the mistake uses instead of the argument."""
    momentum = momentum if momentum_used is None else momentum_used
    eps = eps if eps_used is None else eps_used
    C = weight.shape[0]
    running_mean = torch.zeros(C, dtype=weight.dtype)
    running_var = torch.ones(C, dtype=weight.dtype)
    outputs, means, variances = [], [], []

    def normalise(x, mean, var):
        shape = (1, C) if x.dim() == 2 else (1, C, 1)
        if eps_outside:
            y = (x - mean.view(shape)) / (var.view(shape).sqrt() + eps)
        else:
            y = (x - mean.view(shape)) / torch.sqrt(var.view(shape) + eps)
        return y * weight.view(shape) + bias.view(shape)

    for x in steps:
        dims = (0,) if x.dim() == 2 else dims_3d
        n = x.numel() // C if x.dim() == 2 or dims == (0, 2) else x.shape[0]
        if n_batch_only:
            n = x.shape[0]
        mean = x.mean(dim=dims)
        biased = x.var(dim=dims, unbiased=False)
        unbiased = biased * n / (n - 1)
        if dims == (0, 1):  # per-position statistics (L,), broadcast on the last axis
            shape_var = unbiased if unbiased_norm else biased
            y = (x - mean) / torch.sqrt(shape_var + eps)
            outputs.append(y * weight.view(1, C, 1) + bias.view(1, C, 1))
            mean = biased = unbiased = torch.full((C,), float("nan"), dtype=x.dtype)
        elif mean.dim() > 1:  # per-position statistics (the dims mistake): (C, L)
            shape_mean, shape_var = mean, unbiased if unbiased_norm else biased
            y = (x - shape_mean[None]) / torch.sqrt(shape_var[None] + eps)
            outputs.append(y * weight.view(1, C, 1) + bias.view(1, C, 1))
            mean, biased, unbiased = mean.mean(-1), biased.mean(-1), unbiased.mean(-1)
        else:
            outputs.append(normalise(x, mean, unbiased if unbiased_norm else biased))
        if not no_update:
            m = 1 - momentum if momentum_swapped else momentum
            if cumulative:
                m = 1.0 / (len(means) + 1)
            batch_var = biased if running_biased else unbiased
            running_mean = (1 - m) * running_mean + m * mean
            running_var = (1 - m) * running_var + m * batch_var
        if running_in_training:  # normalised with the (just updated) running statistics
            outputs[-1] = normalise(x, running_mean, running_var)
        means.append(running_mean)
        variances.append(running_var)
    if eval_updates:  # the eval batch updates the running statistics, then normalises
        dims = (0,) if eval_x.dim() == 2 else (0, 2)
        n = eval_x.numel() // C
        batch_var = eval_x.var(dim=dims, unbiased=False) * n / (n - 1)
        running_mean = (1 - momentum) * running_mean + momentum * eval_x.mean(dim=dims)
        running_var = (1 - momentum) * running_var + momentum * batch_var
    if eval_batch:
        dims = (0,) if eval_x.dim() == 2 else (0, 2)
        eval_out = normalise(eval_x, eval_x.mean(dim=dims), eval_x.var(dim=dims, unbiased=False))
    else:
        eval_out = normalise(eval_x, running_mean, running_var)
    return outputs, means, variances, eval_out


_BN_MISTAKES = {
    _BN_UNBIASED: {"unbiased_norm": True},
    _BN_EPS_OUTSIDE: {"eps_outside": True},
    _BN_RUNNING_BIASED: {"running_biased": True},
    _BN_MOMENTUM_SWAPPED: {"momentum_swapped": True},
    _BN_EVAL_BATCH: {"eval_batch": True},
    _BN_NO_UPDATE: {"no_update": True},
    _BN_3D_DIMS: {"dims_3d": (0,)},
    _BN_3D_DIMS_01: {"dims_3d": (0, 1)},
    _BN_WRONG_N: {"n_batch_only": True},
    _BN_TRAIN_RUNNING: {"running_in_training": True},
    _BN_EVAL_UPDATES: {"eval_updates": True},
    _BN_CUMULATIVE: {"cumulative": True},
}


def _batch_inputs(C: int, three_d: bool, seed: int, tiny: bool = False):
    """Three training batches and one eval batch with per-channel offsets and scales."""
    shape = (6, C, 5) if three_d else (8, C)
    view = (1, C, 1) if three_d else (1, C)
    offsets = torch.linspace(-2.0, 3.0, C, dtype=torch.float64).view(view)
    scales = torch.linspace(0.5, 2.5, C, dtype=torch.float64).view(view)
    if tiny:
        scales = scales * 1e-3
    return [offsets + scales * randn(*shape, seed=seed + i) for i in range(4)]


def _batch_norm_case(candidate, init: dict, three_d: bool, seed: int, what: str, tiny=False):
    """One run of three training steps then eval; ``what`` picks what is compared."""

    def run():
        student, reference = build_pair(candidate, ref.BatchNorm1d, kwargs=init)
        *steps, eval_x = _batch_inputs(init["num_features"], three_d, seed, tiny)
        student.train()
        reference.train()
        weight, bias = reference.weight.detach(), reference.bias.detach()
        momentum, eps = reference.momentum, reference.eps

        def simulated(index_or_key):
            def compute(**flags):
                outputs, means, variances, eval_out = _simulate_batch_norm(
                    weight, bias, steps, eval_x, momentum, eps, **flags
                )
                return {"train": outputs, "mean": means, "var": variances, "eval": eval_out}

            mistakes = dict(_BN_MISTAKES)
            if momentum != 0.1:
                text = (
                    f"the `momentum` argument is ignored (you used 0.1, this case uses "
                    f"momentum={momentum:g}): keep self.momentum = momentum"
                )
                mistakes[text] = {"momentum_used": 0.1}
            if eps != 1e-5:
                text = (
                    f"the `eps` argument is ignored (you used 1e-5, this case uses eps={eps:g}): "
                    "keep self.eps = eps"
                )
                mistakes[text] = {"eps_used": 1e-5}
            return [
                (text, lambda flags=flags: _pick(compute(**flags), index_or_key))
                for text, flags in mistakes.items()
            ]

        for step, x in enumerate(steps):
            expected = reference(x)
            got = call_student(
                student,
                x,
                what=f"bn(x) at training step {step + 1}",
                arg_names=("x",),
                error_hint=_bn_error_hint(three_d),
            )
            if what == "train":
                expect_close(
                    got,
                    expected,
                    f"the training-mode output at step {step + 1}",
                    mistakes=simulated(("train", step)),
                )
            if what == "running":
                for name in ("running_mean", "running_var"):
                    got_stat = getattr(student, name, None)
                    if not isinstance(got_stat, torch.Tensor):
                        raise CaseFailed(
                            f"`{name}` is missing: register it with self.register_buffer"
                        )
                    key = "mean" if name == "running_mean" else "var"
                    expect_close(
                        got_stat,
                        getattr(reference, name),
                        f"`{name}` after training step {step + 1}",
                        mistakes=simulated((key, step)),
                    )
                tracked = _count(student)
                if tracked != step + 1:
                    raise CaseFailed(
                        f"`num_batches_tracked` should be {step + 1} after {step + 1} training "
                        f"step(s), got {tracked}: add 1 to it at every training forward pass"
                    )
        if what == "eval":
            student.eval()
            reference.eval()
            expected = reference(eval_x)
            got = call_student(student, eval_x, what="bn(x) in eval mode", arg_names=("x",))
            expect_close(got, expected, "the eval-mode output", mistakes=simulated(("eval", None)))
            tracked = _count(student)
            again = call_student(student, eval_x, what="bn(x) in eval mode", arg_names=("x",))
            if _count(student) != tracked:
                raise CaseFailed(
                    "num_batches_tracked changed in eval mode: update the running statistics "
                    "and the counter only when self.training is True"
                )
            expect_close(
                again,
                expected,
                "the eval-mode output on a second call",
                hints=[
                    lambda _: (
                        "the running statistics must not change in eval mode: update them "
                        "only when self.training is True"
                    )
                ],
            )

    return run


def _count(module) -> int | None:
    tracked = getattr(module, "num_batches_tracked", None)
    return int(tracked) if isinstance(tracked, torch.Tensor) and tracked.numel() == 1 else None


def _pick(simulation: dict, index_or_key):
    key, step = index_or_key
    value = simulation[key]
    return value if step is None else value[step]


def _batch_norm_grad(candidate):
    def run():
        pair = ModulePair(candidate, ref.BatchNorm1d, init={"num_features": 3})
        x = _batch_inputs(3, True, seed=121)[0]
        got, expected = pair.call(
            x, what="bn(x)", arg_names=("x",), grad=True, error_hint=_bn_error_hint(True)
        )
        expect_close(got, expected, "the training-mode output")
        pair.expect_grads(got, expected, ("`x`",))

    return run


_BN_GRAPH = (
    "after a training step on an input that requires grad, `{name}` requires grad (it has "
    "a grad_fn): the running "
    "statistics joined the autograd graph, so copy.deepcopy(model) raises, a backward pass "
    "in eval mode fails ('backward through the graph a second time') and every step's graph "
    "is kept alive. Likely mistake: the running statistics are updated outside "
    "`torch.no_grad()`{rebound}; update them under torch.no_grad(), in place "
    "(`self.{name}.mul_(1 - m).add_(m * batch_stat)`), or from `.detach()`ed batch statistics"
)


def _batch_norm_graph(candidate):
    """The running statistics are state, not part of the model's computation: after a
    training step on an input that requires grad they must not require grad (nor carry a
    grad_fn), and they must still be the module's registered buffers."""

    def run():
        student, _ = build_pair(candidate, ref.BatchNorm1d, kwargs={"num_features": 3})
        student.train()
        x = _batch_inputs(3, False, seed=125)[0].requires_grad_(True)
        call_student(student, x, what="bn(x) in training mode", arg_names=("x",))
        buffers = [name for name, _ in student.named_buffers()]
        for name in ("running_mean", "running_var"):
            if name not in buffers:
                raise CaseFailed(
                    f"after a training step `{name}` is no longer a registered buffer (it is "
                    "not in module.named_buffers()): keep updating the buffer itself, "
                    f"`self.{name}.mul_(1 - m).add_(m * batch_stat)` under torch.no_grad()"
                )
            # read as an attribute: the grader's proxy of the student's module passes on
            # requires_grad (the grad_fn stays in the student's kernel)
            stat = getattr(student, name)
            if stat.requires_grad or stat.grad_fn is not None:
                rebound = " (or rebound, `self.{0} = (1 - m) * self.{0} + m * ...`)"
                raise CaseFailed(_BN_GRAPH.format(name=name, rebound=rebound.format(name)))

    return run


def _batch_norm_fresh_eval(candidate):
    def run():
        pair = ModulePair(candidate, ref.BatchNorm1d, init={"num_features": 4}, train=False)
        reference = pair.reference
        x = _batch_inputs(4, False, seed=131)[0]
        got, expected = pair.call(x, what="bn(x) in eval mode", arg_names=("x",))
        expect_close(
            got,
            expected,
            "the eval-mode output of a fresh module (running_mean 0, running_var 1)",
            mistakes=[
                (
                    _BN_EVAL_BATCH,
                    lambda: _simulate_batch_norm(
                        reference.weight.detach(),
                        reference.bias.detach(),
                        [],
                        x,
                        0.1,
                        1e-5,
                        eval_batch=True,
                    )[3],
                )
            ],
        )

    return run


@checker(
    "batch_norm",
    "BatchNorm1d",
    answer_builtins=(
        "torch.nn.BatchNorm1d",
        "torch.nn.functional.batch_norm",
        "torch.batch_norm",
        "torch.native_batch_norm",
    ),
)
def check_batch_norm(candidate) -> list[Case]:
    """Check the class ``BatchNorm1d(num_features, eps=1e-5, momentum=0.1)``: training
    outputs, running statistics, evaluation, for (B, C) and (B, C, L) inputs."""
    two = {"num_features": 4}
    three = {"num_features": 3, "eps": 1e-3, "momentum": 0.3}
    cases = [
        Case(
            "2-D input (B, C): training outputs",
            _batch_norm_case(candidate, two, False, 111, "train"),
            covers=frozenset({"mode=train"}),
        ),
        Case(
            "2-D input: running_mean, running_var, num_batches_tracked over 3 steps",
            _batch_norm_case(candidate, two, False, 111, "running"),
            covers=frozenset({"mode=train"}),
        ),
        Case(
            "2-D input: eval uses the running statistics",
            _batch_norm_case(candidate, two, False, 111, "eval"),
            covers=frozenset({"mode=train", "mode=eval"}),
        ),
        Case(
            "3-D input (B, C, L), eps=1e-3, momentum=0.3: training outputs",
            _batch_norm_case(candidate, three, True, 115, "train"),
            covers=frozenset({"mode=train", "input=(B, C, L)", "eps", "momentum"}),
        ),
        Case(
            "3-D input: running statistics over 3 steps",
            _batch_norm_case(candidate, three, True, 115, "running"),
            covers=frozenset({"mode=train", "input=(B, C, L)", "eps", "momentum"}),
        ),
        Case(
            "3-D input: eval uses the running statistics",
            _batch_norm_case(candidate, three, True, 115, "eval"),
            covers=frozenset({"mode=train", "mode=eval", "input=(B, C, L)", "eps", "momentum"}),
        ),
        Case(
            "tiny-variance input (variance below eps)",
            _batch_norm_case(candidate, two, False, 119, "train", tiny=True),
        ),
        Case(
            "a fresh module in eval mode",
            _batch_norm_fresh_eval(candidate),
            covers=frozenset({"mode=eval"}),
        ),
        Case(
            "gradients reach weight, bias and x (training mode)",
            _batch_norm_grad(candidate),
            covers=frozenset({"grad", "mode=train", "input=(B, C, L)"}),
        ),
        Case(
            "running statistics stay out of the autograd graph",
            _batch_norm_graph(candidate),
            covers=frozenset({"grad", "mode=train"}),
            support=True,
        ),
    ]
    return without_builtin(cases, "batch_norm", "BatchNorm1d")
