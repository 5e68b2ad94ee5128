"""Checkers for the modern block (chapter 16): ``RMSNorm`` and ``SwiGLU``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attention_course import ffn as ref_ffn
from attention_course import norms as ref_norms

from ._compare import expect_close
from ._data import randn
from ._modules import ModulePair, build_pair
from ._runner import TRIVIAL, Case, CaseFailed, call_student, checker, without_builtin

# ---------------------------------------------------------------- RMSNorm

_RMS_EPS_OUTSIDE = (
    "eps is outside the square root: compute x / sqrt(mean(x²) + eps), not "
    "x / (sqrt(mean(x²)) + eps)"
)
_RMS_MEAN_SUBTRACTED = (
    "you subtracted the mean (that is LayerNorm without its bias): RMSNorm does not centre, "
    "it divides x itself by sqrt(mean(x²) + eps)"
)
_RMS_UNBIASED = (
    "you divided the sum of squares by N - 1 (an unbiased variance, as torch.var's default): "
    "the root mean square divides by N, `x.pow(2).mean(dim, keepdim=True)`"
)
_RMS_VAR = (
    "you used the variance `x.var(...)` (mean subtracted, divided by N - 1) in place of the "
    "mean square: RMSNorm divides x by sqrt(x.pow(2).mean(dim, keepdim=True) + eps)"
)
_RMS_NO_WEIGHT = "`weight` is not applied: finish with y * self.weight"
_RMS_WEIGHT_ADDED = "`weight` is added (y + weight): it is a gain, multiply: y * self.weight"
_RMS_NO_ROOT = (
    "the square root is missing: divide by sqrt(mean(x²) + eps) (or multiply by "
    "torch.rsqrt(...)), not by mean(x²) + eps"
)
_RMS_SUM = (
    "you divided by the L2 norm sqrt(sum(x²)) (F.normalize, or .sum instead of .mean): the "
    "root MEAN square is sqrt(sum(x²) / N), N the number of normalised values"
)
_RMS_EPS_NONE = (
    "eps=None must mean the machine epsilon of the computation's dtype, "
    "`torch.finfo(x.dtype).eps` (as nn.RMSNorm), not a fixed number such as 1e-6 or 1e-5"
)
_RMS_EPS_FLOAT32 = (
    "for a float64 input eps=None is `torch.finfo(torch.float64).eps` (about 2.2e-16): you "
    "used float32's epsilon, or you computed in float32 (`x.float()`): keep the input's dtype "
    "throughout and take eps from it, `torch.finfo(x.dtype).eps`"
)
_RMS_EPS_WEIGHT_DTYPE = (
    "eps=None takes the machine epsilon of the input's dtype, as nn.RMSNorm does: "
    "`torch.finfo(x.dtype).eps`, not the weight's dtype (here a float32 module is given a "
    "float64 input, so eps is float64's, about 2.2e-16, not float32's 1.2e-7)"
)
_RMS_VAR_BIASED = (
    "you used the variance `x.var(..., unbiased=False)`, which subtracts the mean: RMSNorm "
    "uses the mean square of x itself, `x.pow(2).mean(dims, keepdim=True)`"
)
_RMS_WRONG_AXES = (
    "the mean square is not per token: average only over the last len(normalized_shape) "
    "axes (`dim=(-2, -1)` for normalized_shape=(T, D)), keepdim=True; never over the batch "
    "or over every axis"
)
_RMS_MEAN_ABS = (
    "you divided by the mean absolute value mean(|x|): RMSNorm divides by the root mean "
    "square, sqrt(mean(x²) + eps)"
)
_RMS_GAIN_OTHER = (
    "the normalisation is right but the gain is applied differently: the last step is "
    "y * self.weight (not y * (1 + weight), not y / weight)"
)
_RMS_EPS_FALSY = (
    "eps=0.0 was replaced by the machine epsilon: test `self.eps is None`, not "
    "`self.eps or ...` (0.0 is falsy, and nn.RMSNorm(eps=0.0) adds nothing)"
)
_RMS_INIT = (
    "`weight` must start at ones, as nn.RMSNorm's (`torch.ones(normalized_shape)`): a fresh "
    "module's gain is {got}; with zeros the whole model outputs zeros"
)
_RMS_AFFINE_STATE = (
    "elementwise_affine=False: the state_dict must be empty, as nn.RMSNorm's (no parameters "
    "and no buffers: `self.register_parameter('weight', None)`); yours has {keys}"
)
_RMS_EPS_NONE_ERROR = (
    "eps may be None (the default): then use `torch.finfo(x.dtype).eps`, as nn.RMSNorm does"
)


def _rms_norm(
    x,
    dims,
    weight,
    eps,
    *,
    eps_outside=False,
    centre=False,
    unbiased=False,
    root=True,
    total=False,
    add_weight=False,
    variance=False,
    mean_abs=False,
    gain="times",
):
    n = 1
    for d in dims:
        n *= x.shape[d]
    centred = x - x.mean(dim=dims, keepdim=True)
    x_c = centred if centre else x  # the numerator
    statistic = centred if centre or variance else x  # what is squared
    square = (statistic * statistic).sum(dim=dims, keepdim=True)
    if not total:
        square = square / (n - 1 if unbiased else n)
    if mean_abs:
        return x / (x.abs().mean(dim=dims, keepdim=True) + eps) * weight
    if eps_outside:
        y = x_c / (square.sqrt() + eps)
    elif root:
        y = x_c / torch.sqrt(square + eps)
    else:
        y = x_c / (square + eps)
    if weight is not None:
        if add_weight:
            y = y + weight
        elif gain == "one plus":
            y = y * (1 + weight)
        elif gain == "divide":
            y = y / weight
        else:
            y = y * weight
    return y


def _rms_norm_mistakes(module, x: torch.Tensor):
    n = len(module.normalized_shape)
    dims = tuple(range(-n, 0))
    w = module.weight
    eps = torch.finfo(x.dtype).eps if module.eps is None else module.eps

    def rms(weight=w, eps=eps, dims=dims, **kwargs):
        return lambda: _rms_norm(x, dims, weight, eps, **kwargs)

    mistakes = [
        (_RMS_EPS_OUTSIDE, rms(eps_outside=True)),
        (_RMS_MEAN_SUBTRACTED, rms(centre=True)),
        (_RMS_VAR, rms(variance=True, unbiased=True)),
        (_RMS_VAR_BIASED, rms(variance=True)),
        (_RMS_UNBIASED, rms(unbiased=True)),
        (_RMS_NO_ROOT, rms(root=False)),
        (_RMS_SUM, rms(total=True)),
    ]
    if module.eps is None:
        if w is not None and w.dtype != x.dtype:
            mistakes.insert(0, (_RMS_EPS_WEIGHT_DTYPE, rms(eps=torch.finfo(w.dtype).eps)))
        for fixed in (1e-6, 1e-5, 1e-8):
            mistakes.append((_RMS_EPS_NONE, rms(eps=fixed)))
        if x.dtype == torch.float64:
            mistakes.append((_RMS_EPS_FLOAT32, rms(eps=torch.finfo(torch.float32).eps)))
    else:
        if module.eps == 0.0:
            mistakes.append((_RMS_EPS_FALSY, rms(eps=torch.finfo(x.dtype).eps)))
        for fixed in (1e-6, 1e-5, torch.finfo(x.dtype).eps):
            mistakes.append(
                (
                    f"the `eps` argument is ignored (this case uses eps={module.eps:g}): "
                    "use self.eps",
                    rms(eps=fixed),
                )
            )
        mistakes.append(("eps is missing: add it inside the square root", rms(eps=0.0)))
    if n > 1:
        mistakes.append(
            (
                f"you normalised over the last axis only: normalized_shape="
                f"{tuple(module.normalized_shape)} means the mean square over the last {n} axes",
                rms(dims=(-1,)),
            )
        )
    every_axis = tuple(range(x.dim()))
    mistakes += [
        (_RMS_WRONG_AXES, rms(dims=every_axis)),
        (_RMS_WRONG_AXES, rms(dims=(0,))),
    ]
    if w is not None:
        mistakes += [
            (_RMS_MEAN_ABS, rms(mean_abs=True)),
            (_RMS_NO_WEIGHT, rms(weight=None)),
            (_RMS_WEIGHT_ADDED, rms(add_weight=True)),
            (_RMS_GAIN_OTHER, rms(gain="one plus")),
            (_RMS_GAIN_OTHER, rms(gain="divide")),
        ]
    else:
        mistakes.append((_RMS_MEAN_ABS, rms(mean_abs=True, weight=1.0)))
    return mistakes


def _rms_error_hint(error_text: str) -> str | None:
    if "NoneType" in error_text:
        return _RMS_EPS_NONE_ERROR
    return None


def _rms_fresh_module(candidate, init: dict) -> None:
    """What loading the reference weights would hide: a fresh module's gain starts at ones,
    and with ``elementwise_affine=False`` its state_dict is empty (buffers included)."""
    what = "RMSNorm(" + ", ".join(f"{k}={v!r}" for k, v in init.items()) + ")"
    student = call_student(candidate, what=what, **init)
    if not isinstance(student, torch.nn.Module):
        return  # build_pair names this
    if init.get("elementwise_affine", True):
        weight = getattr(student, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.is_floating_point():
            with torch.no_grad():
                if not bool((weight == 1).all()):
                    values = weight.detach().flatten()[:4].tolist()
                    got = ", ".join(f"{v:.3g}" for v in values)
                    raise CaseFailed(_RMS_INIT.format(got=f"[{got}, ...]"))
        return
    try:
        keys = list(student.state_dict())
        buffers = {name for name, _ in student.named_buffers()}
    except Exception:  # noqa: BLE001 - build_pair reports a broken state_dict
        return
    if any(key in buffers for key in keys):  # unexpected parameters: build_pair names them
        raise CaseFailed(_RMS_AFFINE_STATE.format(keys=", ".join(keys)))


def _rms_norm_case(
    candidate,
    init: dict,
    x: torch.Tensor,
    grad: bool = False,
    module_dtype: torch.dtype | None = None,
):
    """``module_dtype`` (default: the input's) is the dtype the module is moved to."""
    module_dtype = x.dtype if module_dtype is None else module_dtype

    def run():
        _rms_fresh_module(candidate, init)
        pair = ModulePair(candidate, ref_norms.RMSNorm, init=init)
        if module_dtype != torch.float64:
            call_student(pair.student.to, module_dtype, what=f"norm.to({module_dtype})")
            pair.reference.to(module_dtype)
        got, expected = pair.call(
            x, what="norm(x)", arg_names=("x",), grad=grad, error_hint=_rms_error_hint
        )
        with torch.no_grad():
            mistakes = _rms_norm_mistakes(pair.reference, x)
        expect_close(got, expected, "the output", mistakes=mistakes)
        if grad:
            pair.expect_grads(got, expected, ("`x`",))

    return run


def _rms_norm_state(candidate, init: dict, names: tuple[str, ...], x=None):
    def run():
        _rms_fresh_module(candidate, init)
        student, _ = build_pair(candidate, ref_norms.RMSNorm, kwargs=init)
        own = dict(student.named_parameters())
        if "bias" in own:
            raise CaseFailed("RMSNorm has no `bias`: only a gain `weight` (nn.RMSNorm has none)")
        for name in names:
            param = getattr(student, name, None)
            if not isinstance(param, torch.nn.Parameter):
                raise CaseFailed(f"`{name}` should be an nn.Parameter of shape normalized_shape")
        if not names and any(p is not None for p in own.values()):
            raise CaseFailed(
                "elementwise_affine=False: the module must have no parameters "
                "(register_parameter('weight', None))"
            )
        if x is not None:
            _rms_norm_case(candidate, init, x)()

    return run


def _with_rms(x: torch.Tensor, rms: list[float]) -> torch.Tensor:
    """``x`` with each row (last axis) scaled to the root mean square ``rms[i]``."""
    rows = x.reshape(-1, x.shape[-1])
    target = torch.tensor(rms, dtype=x.dtype)[:, None]
    return (rows / rows.pow(2).mean(-1, keepdim=True).sqrt() * target).reshape(x.shape)


@checker(
    "rms_norm",
    "RMSNorm",
    answer_builtins=("torch.nn.RMSNorm", "torch.nn.functional.rms_norm", "torch.rms_norm"),
)
def check_rms_norm(candidate) -> list[Case]:
    """Check the class ``RMSNorm(normalized_shape, eps=None, elementwise_affine=True)``
    (``torch.nn.RMSNorm``'s semantics; ``eps=None`` is ``torch.finfo(x.dtype).eps``)."""
    shifted = 1.5 + randn(2, 3, 8, seed=161)  # a non-zero mean: centring changes the output
    # mean square about 1e-6: the six rows' root mean squares are fixed (3e-4 .. 1.6e-3), only
    # their directions drawn, so eps outside the square root (a relative error of eps /
    # (2 * mean square), 1.2e-9 in the first row) is seen under every seed
    tiny = _with_rms(0.5 + randn(2, 3, 8, seed=162), [3e-4, 5e-4, 8e-4, 1e-3, 1.3e-3, 1.6e-3])
    small = 0.1 * (1.0 + randn(2, 5, 7, seed=163))  # odd width; mean square about 0.02
    cases = [
        Case(
            "parameters: `weight` shaped like normalized_shape, no bias",
            _rms_norm_state(candidate, {"normalized_shape": (3, 8)}, ("weight",)),
            weight=TRIVIAL,
            support=True,
        ),
        Case(
            "(B, T, D) input with a non-zero mean, normalized_shape=D (an int), eps=None",
            _rms_norm_case(candidate, {"normalized_shape": 8}, shifted),
            covers=frozenset({"dtype=float64"}),
        ),
        Case(
            "multi-axis normalized_shape=(T, D)",
            _rms_norm_case(candidate, {"normalized_shape": (3, 8)}, shifted),
            covers=frozenset({"normalized_shape=tuple"}),
        ),
        Case(
            "2-D input (N, D), normalized_shape=[D], odd D = 7",
            _rms_norm_case(candidate, {"normalized_shape": [7]}, small[0]),
            covers=frozenset({"normalized_shape=list", "odd D"}),
        ),
        Case(
            "tiny input (mean square 1e-6), eps=None: eps is the dtype's machine epsilon",
            _rms_norm_case(candidate, {"normalized_shape": 8}, tiny),
            covers=frozenset({"eps=None", "tiny input"}),
        ),
        Case(
            "eps=1e-2 on a small input (odd D = 7)",
            _rms_norm_case(candidate, {"normalized_shape": 7, "eps": 1e-2}, small),
            covers=frozenset({"eps", "odd D"}),
        ),
        Case(
            "eps=1e-3, normalized_shape=(5, 7) on a small input",
            _rms_norm_case(candidate, {"normalized_shape": (5, 7), "eps": 1e-3}, small),
            covers=frozenset({"eps", "normalized_shape=tuple"}),
        ),
        Case(
            "elementwise_affine=False: no parameters, the plain normalisation",
            _rms_norm_state(
                candidate, {"normalized_shape": 8, "elementwise_affine": False}, (), shifted
            ),
            covers=frozenset({"elementwise_affine"}),
        ),
        Case(
            "elementwise_affine=False, eps=1e-2, multi-axis (5, 7)",
            _rms_norm_case(
                candidate,
                {"normalized_shape": (5, 7), "eps": 1e-2, "elementwise_affine": False},
                small,
            ),
            covers=frozenset({"elementwise_affine", "eps", "normalized_shape=tuple"}),
        ),
        Case(
            "tiny input, multi-axis normalized_shape=(T, D), eps=None (float64's epsilon)",
            _rms_norm_case(candidate, {"normalized_shape": (3, 8)}, tiny),
            covers=frozenset({"eps=None", "tiny input", "normalized_shape=tuple"}),
        ),
        Case(
            "eps=0.0 on a float64 input of mean square 1e-40 (eps=0.0 adds nothing)",
            _rms_norm_case(candidate, {"normalized_shape": 8, "eps": 0.0}, 1e-17 * tiny),
            covers=frozenset({"eps=0", "tiny input"}),
        ),
        Case(
            "eps=0.0, normalized_shape=(T, D), float32 input of mean square about 1e-6",
            _rms_norm_case(candidate, {"normalized_shape": (3, 8), "eps": 0.0}, tiny.float()),
            covers=frozenset({"eps=0", "tiny input", "dtype=float32"}),
        ),
        Case(
            "float32 input, eps=None",
            _rms_norm_case(candidate, {"normalized_shape": 8}, tiny.float()),
            covers=frozenset({"dtype=float32", "eps=None"}),
        ),
        Case(
            "a float32 module (default dtype) given a float64 input of mean square 1e-6, "
            "eps=None: eps is the input's dtype's machine epsilon",
            _rms_norm_case(candidate, {"normalized_shape": 8}, tiny, module_dtype=torch.float32),
            covers=frozenset({"eps=None", "tiny input", "dtype=float32"}),
        ),
        Case(
            "gradients reach weight and x",
            _rms_norm_case(candidate, {"normalized_shape": (3, 8)}, shifted, grad=True),
            covers=frozenset({"grad", "normalized_shape=tuple"}),
        ),
    ]
    return without_builtin(cases, "rms_norm", "RMSNorm", "square, mean, rsqrt")


# ---------------------------------------------------------------- SwiGLU

_SWIGLU_ON_UP = (
    "SiLU is applied to the up projection w3: it belongs on the gate, w2(silu(w1(x)) * w3(x))"
)
_SWIGLU_NO_UP = (
    "the up projection w3(x) is not multiplied in: the gated unit is silu(w1(x)) * w3(x), then w2"
)
_SWIGLU_GELU = (
    "you used GELU where SwiGLU uses SiLU (that is GEGLU, Shazeer 2020): "
    "F.silu(w1(x)), i.e. w1(x) * sigmoid(w1(x))"
)
_SWIGLU_SIGMOID = (
    "you used sigmoid (Dauphin et al.'s GLU): SwiGLU's gate is SiLU, x * sigmoid(x): F.silu(w1(x))"
)
_SWIGLU_RELU = "you used ReLU (that is ReGLU): SwiGLU's gate is F.silu(w1(x))"
_SWIGLU_NO_ACT = (
    "there is no activation (a bilinear unit): the gate is F.silu(w1(x)), multiplied by w3(x)"
)
_SWIGLU_BOTH = "SiLU is applied to both projections: only the gate w1 goes through SiLU"
_SWIGLU_AFTER = (
    "SiLU is applied after the product: silu(w1(x) * w3(x)); apply it to the gate first, "
    "silu(w1(x)) * w3(x)"
)
_SWIGLU_RESIDUAL = (
    "you added a residual (x + SwiGLU(x)): the residual belongs to the block, the "
    "feed-forward network itself is w2(silu(w1(x)) * w3(x))"
)
_SWIGLU_OUT_ACT = "there is an activation after w2: the output of w2 is not activated"
_SWIGLU_ADDED = "silu(w1(x)) and w3(x) are added: the gate multiplies, w2(silu(w1(x)) * w3(x))"
_SWIGLU_NO_BIAS = (
    "with bias=True your output equals the reference without its biases: call the layers, "
    "self.w1(x), self.w3(x), self.w2(h) (or add each layer's .bias)"
)
_SWIGLU_SHARED = (
    "w1 and w3 act as the same layer (one module assigned twice, or one weight used for "
    "both): create two separate nn.Linear, the gate w1 and the up projection w3"
)
_SWIGLU_RANDOM = (
    "your SwiGLU gives different outputs on two calls with the same input (dropout?): the "
    "contract's SwiGLU has no dropout"
)


def _swiglu_mistakes(module, x: torch.Tensor):
    w1, w2, w3 = module.w1, module.w2, module.w3
    mistakes = [
        (_SWIGLU_ON_UP, lambda: w2(w1(x) * F.silu(w3(x)))),
        (_SWIGLU_NO_UP, lambda: w2(F.silu(w1(x)))),
        (_SWIGLU_GELU, lambda: w2(F.gelu(w1(x)) * w3(x))),
        (_SWIGLU_GELU, lambda: w2(F.gelu(w1(x), approximate="tanh") * w3(x))),
        (_SWIGLU_GELU, lambda: w2(w1(x) * F.gelu(w3(x)))),
        (_SWIGLU_SIGMOID, lambda: w2(torch.sigmoid(w1(x)) * w3(x))),
        (_SWIGLU_RELU, lambda: w2(F.relu(w1(x)) * w3(x))),
        (_SWIGLU_NO_ACT, lambda: w2(w1(x) * w3(x))),
        (_SWIGLU_BOTH, lambda: w2(F.silu(w1(x)) * F.silu(w3(x)))),
        (_SWIGLU_AFTER, lambda: w2(F.silu(w1(x) * w3(x)))),
        (_SWIGLU_RESIDUAL, lambda: x + w2(F.silu(w1(x)) * w3(x))),
        (_SWIGLU_OUT_ACT, lambda: F.silu(w2(F.silu(w1(x)) * w3(x)))),
        (_SWIGLU_ADDED, lambda: w2(F.silu(w1(x)) + w3(x))),
        (_SWIGLU_SHARED, lambda: w2(F.silu(w3(x)) * w3(x))),
        (_SWIGLU_SHARED, lambda: w2(F.silu(w1(x)) * w1(x))),
    ]
    if w1.bias is not None:

        def unbiased():
            gate, up = F.linear(x, w1.weight), F.linear(x, w3.weight)
            return F.linear(F.silu(gate) * up, w2.weight)

        mistakes.append((_SWIGLU_NO_BIAS, unbiased))
    return mistakes


def _swiglu_case(candidate, init: dict, x: torch.Tensor, grad: bool = False):
    def run():
        pair = ModulePair(candidate, ref_ffn.SwiGLU, init=init)
        got, expected = pair.call(x, what="ffn(x)", arg_names=("x",), grad=grad)
        with torch.no_grad():
            mistakes = _swiglu_mistakes(pair.reference, x)
        try:
            expect_close(got, expected, "the output", mistakes=mistakes)
        except CaseFailed:
            with torch.no_grad():
                again = call_student(pair.student, x, what="ffn(x) (a second time)")
            if (
                isinstance(got, torch.Tensor)
                and isinstance(again, torch.Tensor)
                and got.shape == again.shape
                and not torch.equal(got.detach(), again.detach())
            ):
                raise CaseFailed(_SWIGLU_RANDOM) from None
            raise
        if grad:
            pair.expect_grads(got, expected, ("`x`",))

    return run


def _swiglu_state(candidate):
    def run():
        student, _ = build_pair(candidate, ref_ffn.SwiGLU, kwargs={"d_model": 6, "d_ff": 10})
        shapes = {"w1": (10, 6), "w3": (10, 6), "w2": (6, 10)}
        roles = {"w1": "gate, D -> F", "w3": "up, D -> F", "w2": "down, F -> D"}
        for name, shape in shapes.items():
            layer = getattr(student, name, None)
            if not isinstance(layer, torch.nn.Linear):
                raise CaseFailed(f"`{name}` should be an nn.Linear ({roles[name]})")
            if tuple(layer.weight.shape) != shape:
                raise CaseFailed(
                    f"`{name}.weight` has shape {tuple(layer.weight.shape)}, expected {shape} "
                    f"({roles[name]})"
                )
            if layer.bias is not None:
                raise CaseFailed(f"`{name}` has a bias: with bias=False (the default) it has none")

    return run


@checker("swiglu", "SwiGLU")
def check_swiglu(candidate) -> list[Case]:
    """Check the class ``SwiGLU(d_model, d_ff, bias=False)``:
    ``w2(silu(w1(x)) * w3(x))`` with ``w1`` the gate, ``w3`` the up and ``w2`` the down
    projection."""
    x = randn(2, 3, 8, seed=171)
    return [
        Case(
            "w1, w3 (D -> F) and w2 (F -> D) are bias-free nn.Linear",
            _swiglu_state(candidate),
            weight=TRIVIAL,
            support=True,
        ),
        Case(
            "(B, T, D) input, d_model=8, d_ff=12",
            _swiglu_case(candidate, {"d_model": 8, "d_ff": 12}, x),
        ),
        Case(
            "odd sizes: d_model=5, d_ff=7, 2-D input (N, D)",
            _swiglu_case(candidate, {"d_model": 5, "d_ff": 7}, randn(4, 5, seed=172)),
            covers=frozenset({"odd sizes"}),
        ),
        Case(
            "d_ff < d_model (d_model=8, d_ff=3)",
            _swiglu_case(candidate, {"d_model": 8, "d_ff": 3}, x),
        ),
        Case(
            "T = 1",
            _swiglu_case(candidate, {"d_model": 8, "d_ff": 12}, x[:, :1]),
            weight=TRIVIAL,
        ),
        Case(
            "bias=True",
            _swiglu_case(candidate, {"d_model": 8, "d_ff": 12, "bias": True}, x),
            covers=frozenset({"bias"}),
        ),
        Case(
            "gradients reach w1, w2, w3 and x",
            _swiglu_case(candidate, {"d_model": 5, "d_ff": 7}, randn(2, 3, 5, seed=173), grad=True),
            covers=frozenset({"grad", "odd sizes"}),
        ),
    ]
