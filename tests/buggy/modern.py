"""Buggy RMSNorm and SwiGLU (chapter 16)."""

import torch
import torch.nn.functional as F
from torch import nn


class _RMSNormBase(nn.Module):
    def __init__(self, normalized_shape, eps=None, elementwise_affine=True):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(self.normalized_shape))
        else:
            self.register_parameter("weight", None)

    def dims(self):
        return tuple(range(-len(self.normalized_shape), 0))

    def epsilon(self, x):
        return torch.finfo(x.dtype).eps if self.eps is None else self.eps

    def normalise(self, x):
        ms = x.pow(2).mean(dim=self.dims(), keepdim=True)
        return x / torch.sqrt(ms + self.epsilon(x))

    def forward(self, x):
        y = self.normalise(x)
        if self.weight is not None:
            y = y * self.weight
        return y


class RMSNormEpsOutside(_RMSNormBase):
    """x / (rms + eps): eps outside the square root (visible only with an explicit eps)."""

    def normalise(self, x):
        ms = x.pow(2).mean(dim=self.dims(), keepdim=True)
        return x / (ms.sqrt() + self.epsilon(x))


class RMSNormSubtractsMean(_RMSNormBase):
    """Centres x first: LayerNorm without the bias."""

    def normalise(self, x):
        x = x - x.mean(dim=self.dims(), keepdim=True)
        ms = x.pow(2).mean(dim=self.dims(), keepdim=True)
        return x / torch.sqrt(ms + self.epsilon(x))


class RMSNormUnbiased(_RMSNormBase):
    """Divides the sum of squares by N - 1."""

    def normalise(self, x):
        n = 1
        for d in self.dims():
            n *= x.shape[d]
        ms = x.pow(2).sum(dim=self.dims(), keepdim=True) / (n - 1)
        return x / torch.sqrt(ms + self.epsilon(x))


class RMSNormUsesVar(_RMSNormBase):
    """Uses x.var() (centred and unbiased) in place of the mean square."""

    def normalise(self, x):
        var = x.var(dim=self.dims(), keepdim=True)
        return x / torch.sqrt(var + self.epsilon(x))


class RMSNormNoWeight(_RMSNormBase):
    """Has a weight but never multiplies by it."""

    def forward(self, x):
        return self.normalise(x)


class RMSNormNoRoot(_RMSNormBase):
    """Divides by the mean square, not its root."""

    def normalise(self, x):
        ms = x.pow(2).mean(dim=self.dims(), keepdim=True)
        return x / (ms + self.epsilon(x))


class RMSNormL2(_RMSNormBase):
    """Divides by the L2 norm (the sum of squares, not the mean)."""

    def normalise(self, x):
        ss = x.pow(2).sum(dim=self.dims(), keepdim=True)
        return x / torch.sqrt(ss + self.epsilon(x))


class RMSNormFixedEps(_RMSNormBase):
    """Treats eps=None as 1e-6 (LLaMA's value) instead of the dtype's machine epsilon."""

    def epsilon(self, x):
        return 1e-6 if self.eps is None else self.eps


class RMSNormFloat32Eps(_RMSNormBase):
    """Uses float32's epsilon for eps=None, whatever the input's dtype."""

    def epsilon(self, x):
        return torch.finfo(torch.float32).eps if self.eps is None else self.eps


class RMSNormEpsNoneCrash(_RMSNormBase):
    """Adds self.eps even when it is None: a TypeError with the default."""

    def epsilon(self, x):
        return self.eps


class RMSNormHardcodedEps(_RMSNormBase):
    """Writes 1e-6 into the formula whatever eps is given."""

    def epsilon(self, x):
        return 1e-6


class RMSNormLastAxisOnly(_RMSNormBase):
    """The mean square over dim=-1 only, even for a multi-axis normalized_shape."""

    def dims(self):
        return (-1,)


class RMSNormWithBias(_RMSNormBase):
    """Adds a bias parameter, as LayerNorm has: the state_dict has an extra key."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True):
        super().__init__(normalized_shape, eps, elementwise_affine)
        if elementwise_affine:
            self.bias = nn.Parameter(torch.zeros(self.normalized_shape))

    def forward(self, x):
        y = super().forward(x)
        return y + self.bias if self.elementwise_affine else y


class RMSNormAlwaysWeight(_RMSNormBase):
    """Creates a weight even with elementwise_affine=False."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True):
        super().__init__(normalized_shape, eps, True)


class RMSNormCallsBuiltin(_RMSNormBase):
    """Calls F.rms_norm instead of writing the normalisation."""

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)


class RMSNormZeroInit(_RMSNormBase):
    """The gain starts at zeros, not ones: hidden once reference weights are loaded."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True):
        super().__init__(normalized_shape, eps, elementwise_affine)
        if self.weight is not None:
            nn.init.zeros_(self.weight)


class RMSNormBufferWeight(_RMSNormBase):
    """elementwise_affine=False registers a buffer `weight` of ones: a non-empty state_dict."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True):
        super().__init__(normalized_shape, eps, elementwise_affine)
        if not elementwise_affine:
            del self.weight
            self.register_buffer("weight", torch.ones(self.normalized_shape))


class RMSNormEpsFalsy(_RMSNormBase):
    """`self.eps or finfo(...)`: eps=0.0 silently becomes the machine epsilon."""

    def epsilon(self, x):
        return self.eps or torch.finfo(x.dtype).eps


class RMSNormBiasedVar(_RMSNormBase):
    """x.var(unbiased=False): the mean is still subtracted."""

    def normalise(self, x):
        var = x.var(dim=self.dims(), keepdim=True, unbiased=False)
        return x / torch.sqrt(var + self.epsilon(x))


class RMSNormMeanOverAll(_RMSNormBase):
    """The mean square over every axis, batch included."""

    def normalise(self, x):
        return x / torch.sqrt(x.pow(2).mean() + self.epsilon(x))


class RMSNormMeanAbs(_RMSNormBase):
    """Divides by mean |x| instead of the root mean square."""

    def normalise(self, x):
        return x / (x.abs().mean(dim=self.dims(), keepdim=True) + self.epsilon(x))


class RMSNormOnePlusWeight(_RMSNormBase):
    """Gemma's y * (1 + weight) with the contract's ones initialisation."""

    def forward(self, x):
        y = self.normalise(x)
        return y if self.weight is None else y * (1 + self.weight)


class _SwiGLUBase(nn.Module):
    def __init__(self, d_model, d_ff, bias=False):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w3 = nn.Linear(d_model, d_ff, bias=bias)
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SwiGLUSiluOnUp(_SwiGLUBase):
    """SiLU on the up projection w3 instead of the gate w1."""

    def forward(self, x):
        return self.w2(self.w1(x) * F.silu(self.w3(x)))


class SwiGLUNoUp(_SwiGLUBase):
    """Forgets to multiply by the up projection: w2(silu(w1(x)))."""

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)))


class SwiGLUGelu(_SwiGLUBase):
    """GELU for SiLU (GEGLU)."""

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)) * self.w3(x))


class SwiGLUSigmoid(_SwiGLUBase):
    """sigmoid for SiLU (the original GLU)."""

    def forward(self, x):
        return self.w2(torch.sigmoid(self.w1(x)) * self.w3(x))


class SwiGLUSiluAfterProduct(_SwiGLUBase):
    """SiLU of the product: silu(w1(x) * w3(x))."""

    def forward(self, x):
        return self.w2(F.silu(self.w1(x) * self.w3(x)))


class SwiGLUResidual(_SwiGLUBase):
    """Adds x to the output."""

    def forward(self, x):
        return x + super().forward(x)


class SwiGLUIgnoresBias(_SwiGLUBase):
    """Never creates biases, whatever bias says."""

    def __init__(self, d_model, d_ff, bias=False):
        super().__init__(d_model, d_ff, bias=False)


class SwiGLUGateAdded(_SwiGLUBase):
    """Adds the gate to the up projection instead of multiplying."""

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) + self.w3(x))


class SwiGLUDropout(_SwiGLUBase):
    """Dropout on the hidden units, as chapter 8's FFN: the output is random in training."""

    def __init__(self, d_model, d_ff, bias=False):
        super().__init__(d_model, d_ff, bias)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return self.w2(self.drop(F.silu(self.w1(x)) * self.w3(x)))


class SwiGLUBiasesUnused(_SwiGLUBase):
    """Multiplies by the weights by hand and never adds the biases."""

    def forward(self, x):
        gate, up = x @ self.w1.weight.T, x @ self.w3.weight.T
        return (F.silu(gate) * up) @ self.w2.weight.T


class SwiGLUSharedGateUp(_SwiGLUBase):
    """w3 is the same module as w1."""

    def __init__(self, d_model, d_ff, bias=False):
        super().__init__(d_model, d_ff, bias)
        self.w3 = self.w1


class SwiGLUFusedNames(nn.Module):
    """One fused gate-and-up matrix named w13: the contract's names w1, w3 do not load."""

    def __init__(self, d_model, d_ff, bias=False):
        super().__init__()
        self.w13 = nn.Linear(d_model, 2 * d_ff, bias=bias)
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x):
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


CATALOGUE = [
    ("rms_norm", "eps outside sqrt", RMSNormEpsOutside, "eps is outside the square root"),
    ("rms_norm", "mean subtracted", RMSNormSubtractsMean, "you subtracted the mean"),
    ("rms_norm", "unbiased (N - 1)", RMSNormUnbiased, "divided the sum of squares by N - 1"),
    ("rms_norm", "x.var()", RMSNormUsesVar, "you used the variance"),
    ("rms_norm", "weight missing", RMSNormNoWeight, "`weight` is not applied"),
    ("rms_norm", "no square root", RMSNormNoRoot, "the square root is missing"),
    ("rms_norm", "L2 norm", RMSNormL2, "L2 norm"),
    ("rms_norm", "eps=None as 1e-6", RMSNormFixedEps, "eps=None must mean the machine epsilon"),
    ("rms_norm", "float32 eps for float64", RMSNormFloat32Eps, "used float32's epsilon"),
    ("rms_norm", "eps=None crashes", RMSNormEpsNoneCrash, "torch.finfo(x.dtype).eps"),
    ("rms_norm", "hard-coded eps", RMSNormHardcodedEps, "`eps` argument is ignored"),
    ("rms_norm", "last axis only", RMSNormLastAxisOnly, "last axis only"),
    ("rms_norm", "a bias", RMSNormWithBias, "unexpected: bias"),
    ("rms_norm", "weight without affine", RMSNormAlwaysWeight, "unexpected: weight"),
    ("rms_norm", "calls F.rms_norm", RMSNormCallsBuiltin, "do not call the built-in"),
    ("rms_norm", "gain starts at zeros", RMSNormZeroInit, "`weight` must start at ones"),
    ("rms_norm", "buffer without affine", RMSNormBufferWeight, "the state_dict must be empty"),
    ("rms_norm", "eps or machine eps", RMSNormEpsFalsy, "eps=0.0 was replaced"),
    ("rms_norm", "biased x.var()", RMSNormBiasedVar, "x.var(..., unbiased=False)"),
    ("rms_norm", "mean over every axis", RMSNormMeanOverAll, "the mean square is not per token"),
    ("rms_norm", "mean |x|", RMSNormMeanAbs, "mean absolute value"),
    ("rms_norm", "y * (1 + weight)", RMSNormOnePlusWeight, "the gain is applied differently"),
    ("swiglu", "SiLU on the up projection", SwiGLUSiluOnUp, "SiLU is applied to the up"),
    ("swiglu", "gate not multiplied", SwiGLUNoUp, "w3(x) is not multiplied in"),
    ("swiglu", "GELU for SiLU", SwiGLUGelu, "GELU where SwiGLU uses SiLU"),
    ("swiglu", "sigmoid for SiLU", SwiGLUSigmoid, "you used sigmoid"),
    ("swiglu", "SiLU after the product", SwiGLUSiluAfterProduct, "SiLU is applied after the"),
    ("swiglu", "residual inside", SwiGLUResidual, "you added a residual"),
    ("swiglu", "bias ignored", SwiGLUIgnoresBias, "missing: w1.bias"),
    ("swiglu", "fused w13", SwiGLUFusedNames, "missing: w1.weight"),
    ("swiglu", "gate added", SwiGLUGateAdded, "the gate multiplies"),
    ("swiglu", "dropout inside", SwiGLUDropout, "(dropout?)"),
    ("swiglu", "biases never added", SwiGLUBiasesUnused, "equals the reference without its biases"),
    ("swiglu", "w3 is w1", SwiGLUSharedGateUp, "w1 and w3 act as the same layer"),
]


# ---------------------------------------------------------------- issue 24, round 3 (verdicts)
# Kept apart from CATALOGUE above; tests/test_verdicts_round3.py runs ROUND3.


class RMSNormUpcastsToFloat32(_RMSNormBase):
    """Hugging Face Llama's pattern, `x.to(torch.float32)` ... `.to(input_dtype)`: an upcast
    for float16, but a float64 input is computed in float32 inside."""

    def normalise(self, x):
        h = x.to(torch.float32)
        ms = h.pow(2).mean(dim=self.dims(), keepdim=True)
        return (h * torch.rsqrt(ms + self.epsilon(x))).to(x.dtype)


class SwiGLUGateInFloat32(_SwiGLUBase):
    """Computes the gated product in float32 (`.float()` ... `.to(x.dtype)`)."""

    def forward(self, x):
        hidden = F.silu(self.w1(x).float()) * self.w3(x).float()
        return self.w2(hidden.to(x.dtype))


ROUND3 = [
    ("rms_norm", "computed in float32 inside", RMSNormUpcastsToFloat32, "float32 inside"),
    ("swiglu", "gate computed in float32", SwiGLUGateInFloat32, "float32 inside"),
]


# Round 5 (a fresh student, set 16): kept apart; tests/test_verdicts_round5.py runs it.


class RMSNormEpsFromWeightDtype(_RMSNormBase):
    """eps=None taken from the weight's dtype, not the input's: the same for a module and an
    input of one dtype, float32's epsilon for a float32 module given a float64 input."""

    def epsilon(self, x):
        source = self.weight.dtype if self.weight is not None else x.dtype
        return torch.finfo(source).eps if self.eps is None else self.eps
