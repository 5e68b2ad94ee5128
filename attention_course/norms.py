"""Normalisation from scratch: LayerNorm (per token) and BatchNorm (per feature).

Both compute ``(x - mean) / sqrt(var + eps) * weight + bias`` with the *biased*
variance (divide by N). They differ in which axes the mean and variance are
taken over:

- LayerNorm: over the last ``len(normalized_shape)`` axes of each sample, so a
  token's output never depends on other tokens or on the batch;
- BatchNorm1d: over the batch (and length) axes for each channel, with running
  estimates for evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ._validate import LOW_PRECISION, check_positive_int, require_float, shape_str


def _as_normalized_shape(normalized_shape: int | Sequence[int]) -> tuple[int, ...]:
    """``normalized_shape`` as a non-empty tuple of positive ints (an int ``n`` -> ``(n,)``),
    as ``nn.LayerNorm`` and ``nn.RMSNorm`` accept it."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    normalized_shape = tuple(normalized_shape)
    if not normalized_shape:
        raise ValueError("normalized_shape: got (), expected at least one dimension")
    for size in normalized_shape:
        check_positive_int("normalized_shape", size)
    return normalized_shape


def _check_normalized_input(x: torch.Tensor, normalized_shape: tuple[int, ...]) -> int:
    """The one input check of LayerNorm and RMSNorm: a float tensor whose trailing
    dimensions are ``normalized_shape``. Returns the number of normalised axes."""
    require_float("x", x)
    n = len(normalized_shape)
    if x.dim() < n or tuple(x.shape[x.dim() - n :]) != normalized_shape:
        raise ValueError(
            f"x: got shape {shape_str(x.shape)}, expected trailing dimensions "
            f"{shape_str(normalized_shape)} (normalized_shape)"
        )
    return n


class LayerNorm(nn.Module):
    """Layer normalisation (Ba et al., 2016). Matches ``nn.LayerNorm``.

    .. math:: y = \\frac{x - \\mathrm{E}[x]}{\\sqrt{\\mathrm{Var}[x] + \\epsilon}} \\gamma + \\beta

    Mean and biased variance are taken over the trailing ``normalized_shape``
    axes; ``weight`` (gamma) and ``bias`` (beta) have shape ``normalized_shape``
    and the same ``state_dict`` keys as ``nn.LayerNorm``. The same computation
    runs in training and evaluation. (The Annotated Transformer's LayerNorm
    uses the unbiased std and adds eps outside the root; this one does not.)

    Shapes:
        x: ``(*, *normalized_shape)``; returns the same shape.
    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
    ) -> None:
        super().__init__()
        normalized_shape = _as_normalized_shape(normalized_shape)
        self.normalized_shape = normalized_shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(normalized_shape))
            self.bias = nn.Parameter(torch.zeros(normalized_shape))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = _check_normalized_input(x, self.normalized_shape)
        dtype = x.dtype
        if dtype in LOW_PRECISION:
            x = x.float()  # accumulate statistics in float32, as PyTorch does
        dims = tuple(range(-n, 0))  # the normalised axes, e.g. (-1,) or (-3, -2, -1)
        mean = x.mean(dim=dims, keepdim=True)  # (*, 1, ..., 1)
        centred = x - mean
        var = (centred * centred).mean(dim=dims, keepdim=True)  # biased: divide by N
        y = centred * torch.rsqrt(var + self.eps)  # divide by sqrt(var + eps): eps inside the root
        if self.elementwise_affine:
            y = y * self.weight + self.bias
        return y.to(dtype)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        )


class BatchNorm1d(nn.Module):
    """Batch normalisation (Ioffe & Szegedy, 2015). Matches ``nn.BatchNorm1d``.

    Training: normalise each channel with the batch mean and *biased* variance,
    and update the running estimates
    ``running = (1 - momentum) * running + momentum * batch_statistic`` — with
    the *unbiased* variance for ``running_var``, as PyTorch does. ``momentum=None``
    gives a cumulative average. Evaluation: normalise with the running
    estimates, so the output no longer depends on the rest of the batch.

    ``weight``, ``bias`` and the buffers ``running_mean``, ``running_var``,
    ``num_batches_tracked`` have the same names as in ``nn.BatchNorm1d``.

    Shapes:
        x: ``(B, C)`` or ``(B, C, L)``; statistics over ``B`` (and ``L``);
        returns the same shape.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1):
        super().__init__()
        check_positive_int("num_features", num_features)
        if momentum is not None and not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum: got {momentum!r}, expected a float in [0, 1] or None")
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        require_float("x", x)
        C = self.num_features
        if x.dim() not in (2, 3) or x.shape[1] != C:
            raise ValueError(
                f"x: got shape {shape_str(x.shape)}, expected (B, {C}) or (B, {C}, L) "
                f"with num_features={C} channels in dimension 1"
            )
        dims = (0,) if x.dim() == 2 else (0, 2)  # every axis except the channels
        shape = (1, C) if x.dim() == 2 else (1, C, 1)  # to broadcast per-channel values
        n = x.numel() // C  # values per channel in this batch
        if self.training and n <= 1:
            raise ValueError(
                f"x: got shape {shape_str(x.shape)}, expected more than 1 value per channel "
                f"when training (a variance needs at least two values)"
            )
        if self.training:
            mean = x.mean(dim=dims)  # (C,)
            var = ((x - mean.view(shape)) ** 2).mean(dim=dims)  # biased, used to normalise
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = self.momentum
                if m is None:
                    m = 1.0 / float(self.num_batches_tracked)  # cumulative moving average
                unbiased = var * n / (n - 1)  # the running estimate uses N - 1
                self.running_mean.mul_(1 - m).add_(m * mean)
                self.running_var.mul_(1 - m).add_(m * unbiased)
        else:
            mean, var = self.running_mean, self.running_var
        y = (x - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
        return y * self.weight.view(shape) + self.bias.view(shape)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class RMSNorm(nn.Module):
    """Root-mean-square normalisation (Zhang & Sennrich, 2019). Matches ``nn.RMSNorm``.

    .. math:: y = \\frac{x}{\\sqrt{\\frac{1}{n}\\sum_i x_i^2 + \\epsilon}} \\gamma

    LayerNorm without the mean: no centring and no ``bias``, only a rescaling by
    the root mean square over the trailing ``normalized_shape`` axes (eps inside
    the root). ``weight`` (gamma, initialised to ones) has shape
    ``normalized_shape`` and the same ``state_dict`` key as ``nn.RMSNorm``;
    ``elementwise_affine=False`` leaves it out (``weight`` is ``None``).

    ``eps=None`` uses, as PyTorch does, the machine epsilon of the dtype the
    computation runs in: ``torch.finfo(torch.float32).eps`` (about 1.2e-7) for
    float32, float16 and bfloat16 inputs (the last two are computed in float32,
    then cast back), ``torch.finfo(torch.float64).eps`` for float64. LLaMA
    passes an explicit ``eps`` (1e-6 or 1e-5); Hugging Face: ``LlamaRMSNorm``.

    Shapes:
        x: ``(*, *normalized_shape)``; returns the same shape.
    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None = None,
        elementwise_affine: bool = True,
    ) -> None:
        super().__init__()
        normalized_shape = _as_normalized_shape(normalized_shape)
        if eps is not None and (isinstance(eps, bool) or not eps >= 0):
            raise ValueError(f"eps: got {eps!r}, expected None or a number >= 0")
        self.normalized_shape = normalized_shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(normalized_shape))
        else:
            self.register_parameter("weight", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = _check_normalized_input(x, self.normalized_shape)
        dtype = x.dtype
        if dtype in LOW_PRECISION:
            x = x.float()  # compute in float32, as PyTorch does
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps  # the computation's eps
        dims = tuple(range(-n, 0))  # the normalised axes, e.g. (-1,) or (-3, -2, -1)
        mean_square = (x * x).mean(dim=dims, keepdim=True)  # (*, 1, ..., 1); no mean subtracted
        y = x * torch.rsqrt(mean_square + eps)  # divide by the RMS: eps inside the root
        if self.elementwise_affine:
            y = y * self.weight
        return y.to(dtype)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        )


def make_norm(norm: str, d_model: int) -> nn.Module:
    """The normalisation layer a :class:`~attention_course.GPT` block uses.

    ``"layer"``: ``torch.nn.LayerNorm(d_model)`` (PyTorch's fused kernel; chapter 7's
    :class:`LayerNorm` computes the same); ``"rms"``: :class:`RMSNorm` ``(d_model)`` with
    ``eps=None`` (the dtype's machine epsilon, as ``nn.RMSNorm``).
    """
    if norm == "layer":
        return nn.LayerNorm(d_model)
    if norm == "rms":
        return RMSNorm(d_model)
    raise ValueError(f"norm: got {norm!r}, expected one of ('layer', 'rms')")
