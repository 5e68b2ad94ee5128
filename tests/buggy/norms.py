"""Buggy LayerNorm and BatchNorm1d."""

import torch
from torch import nn


class _LayerNormBase(nn.Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(self.normalized_shape))
            self.bias = nn.Parameter(torch.zeros(self.normalized_shape))

    def dims(self):
        return tuple(range(-len(self.normalized_shape), 0))

    def normalise(self, x):
        mean = x.mean(dim=self.dims(), keepdim=True)
        var = x.var(dim=self.dims(), keepdim=True, unbiased=False)
        return (x - mean) / torch.sqrt(var + self.eps)

    def forward(self, x):
        y = self.normalise(x)
        if self.elementwise_affine:
            y = y * self.weight + self.bias
        return y


class LayerNormUnbiased(_LayerNormBase):
    """Uses torch.var's default, the unbiased variance (N - 1)."""

    def normalise(self, x):
        mean = x.mean(dim=self.dims(), keepdim=True)
        var = x.var(dim=self.dims(), keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps)


class LayerNormEpsOutside(_LayerNormBase):
    """The Annotated Transformer's form: (x - mean) / (std + eps), biased std."""

    def normalise(self, x):
        mean = x.mean(dim=self.dims(), keepdim=True)
        std = x.var(dim=self.dims(), keepdim=True, unbiased=False).sqrt()
        return (x - mean) / (std + self.eps)


class LayerNormLastAxisOnly(_LayerNormBase):
    """Normalises over dim=-1 only, even when normalized_shape has several axes."""

    def dims(self):
        return (-1,)


class LayerNormMeanOfRowVariances(_LayerNormBase):
    """For normalized_shape=(T, D): the mean over all T * D numbers, but the variance is the
    mean of the rows' variances (each row about its own mean), not the variance about the
    overall mean: right when the rows have equal means, wrong otherwise."""

    def normalise(self, x):
        mean = x.mean(dim=self.dims(), keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False).mean(dim=self.dims(), keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps)


class LayerNormTokenAxis(_LayerNormBase):
    """Normalises over dim=-2 (the tokens of a (B, T, D) input), not the features."""

    def dims(self):
        return (-2,)


class LayerNormBatchAxis(_LayerNormBase):
    """Normalises over dim=0, the batch: BatchNorm's statistics."""

    def dims(self):
        return (0,)


class LayerNormGammaBeta(nn.Module):
    """Names its parameters gamma and beta: the reference weights do not load."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.eps = eps
        self.dims = tuple(range(-len(normalized_shape), 0))
        self.gamma = nn.Parameter(torch.ones(normalized_shape))
        self.beta = nn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x):
        mean = x.mean(dim=self.dims, keepdim=True)
        var = x.var(dim=self.dims, keepdim=True, unbiased=False)
        return (x - mean) / torch.sqrt(var + self.eps) * self.gamma + self.beta


class LayerNormHardcodedEps(_LayerNormBase):
    """Writes 1e-5 into the formula instead of using self.eps."""

    def normalise(self, x):
        mean = x.mean(dim=self.dims(), keepdim=True)
        var = x.var(dim=self.dims(), keepdim=True, unbiased=False)
        return (x - mean) / torch.sqrt(var + 1e-5)


class _BatchNormBase(nn.Module):
    def __init__(self, num_features, eps=1e-5, momentum=0.1):
        super().__init__()
        self.eps = eps
        self.momentum = momentum
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def stats_dims(self, x):
        return (0,) if x.dim() == 2 else (0, 2)

    def update(self, mean, var, n):
        with torch.no_grad():
            m = self.momentum
            self.running_mean.mul_(1 - m).add_(m * mean)
            self.running_var.mul_(1 - m).add_(m * var * n / (n - 1))
            self.num_batches_tracked += 1

    def use_batch_stats(self):
        return self.training

    def batch_var(self, x, dims):
        return x.var(dim=dims, unbiased=False)

    def normalise_with(self, x, mean, var):
        shape = (1, -1) if x.dim() == 2 else (1, -1, 1)
        y = (x - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
        return y * self.weight.view(shape) + self.bias.view(shape)

    def forward(self, x):
        dims = self.stats_dims(x)
        if self.use_batch_stats():
            mean, var = x.mean(dim=dims), self.batch_var(x, dims)
            if self.training:
                self.update(mean, var, x.numel() // x.shape[1])
        else:
            mean, var = self.running_mean, self.running_var
        return self.normalise_with(x, mean, var)


class BatchNormRunningStatsInTraining(_BatchNormBase):
    """Updates the running statistics in training, then normalises with them."""

    def forward(self, x):
        dims = self.stats_dims(x)
        if self.training:
            self.update(x.mean(dim=dims), self.batch_var(x, dims), x.numel() // x.shape[1])
        return self.normalise_with(x, self.running_mean, self.running_var)


class BatchNormUpdatesInEval(_BatchNormBase):
    """Updates the running statistics in eval mode too (from the eval batch), then
    normalises with them."""

    def forward(self, x):
        if self.training:
            return super().forward(x)
        dims = self.stats_dims(x)
        with torch.no_grad():
            n = x.numel() // x.shape[1]
            m = self.momentum
            self.running_mean.mul_(1 - m).add_(m * x.mean(dim=dims))
            self.running_var.mul_(1 - m).add_(m * self.batch_var(x, dims) * n / (n - 1))
        return self.normalise_with(x, self.running_mean, self.running_var)


class BatchNormCumulative(_BatchNormBase):
    """Running statistics as the cumulative average of all batches (momentum=None)."""

    def update(self, mean, var, n):
        with torch.no_grad():
            self.num_batches_tracked += 1
            m = 1.0 / float(self.num_batches_tracked)
            self.running_mean.mul_(1 - m).add_(m * mean)
            self.running_var.mul_(1 - m).add_(m * var * n / (n - 1))


class BatchNormFixedMomentum(_BatchNormBase):
    """Ignores the momentum argument: always 0.1."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1):
        super().__init__(num_features, eps, 0.1)


class BatchNormFixedEps(_BatchNormBase):
    """Ignores the eps argument: always 1e-5."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1):
        super().__init__(num_features, 1e-5, momentum)


class BatchNormUnbiased(_BatchNormBase):
    """Normalises the batch with torch.var's default unbiased variance."""

    def batch_var(self, x, dims):
        return x.var(dim=dims)

    def update(self, mean, var, n):
        with torch.no_grad():
            m = self.momentum
            self.running_mean.mul_(1 - m).add_(m * mean)
            self.running_var.mul_(1 - m).add_(m * var)
            self.num_batches_tracked += 1


class BatchNormRunningBiased(_BatchNormBase):
    """Updates running_var with the biased batch variance."""

    def update(self, mean, var, n):
        with torch.no_grad():
            m = self.momentum
            self.running_mean.mul_(1 - m).add_(m * mean)
            self.running_var.mul_(1 - m).add_(m * var)
            self.num_batches_tracked += 1


class BatchNormMomentumSwapped(_BatchNormBase):
    """Keeps a fraction `momentum` of the old running value (0.1) and 0.9 of the new batch."""

    def update(self, mean, var, n):
        with torch.no_grad():
            m = self.momentum
            self.running_mean.mul_(m).add_((1 - m) * mean)
            self.running_var.mul_(m).add_((1 - m) * var * n / (n - 1))
            self.num_batches_tracked += 1


class BatchNormEvalUsesBatch(_BatchNormBase):
    """Always normalises with the batch statistics, even in eval mode."""

    def use_batch_stats(self):
        return True


class BatchNormOnlyBatchAxis(_BatchNormBase):
    """For (B, C, L) inputs reduces over dim 0 only: one mean per channel AND position."""

    def stats_dims(self, x):
        return (0,)


class BatchNormForgetsCounter(_BatchNormBase):
    """Never increments num_batches_tracked."""

    def update(self, mean, var, n):
        with torch.no_grad():
            m = self.momentum
            self.running_mean.mul_(1 - m).add_(m * mean)
            self.running_var.mul_(1 - m).add_(m * var * n / (n - 1))


class BatchNormCorrectionUsesBatchSize(_BatchNormBase):
    """Uses N = B (x.shape[0]) in running_var's N / (N - 1), also for (B, C, L) inputs."""

    def forward(self, x):
        if self.training:
            self._batch = x.shape[0]
        return super().forward(x)

    def update(self, mean, var, n):
        super().update(mean, var, self._batch)


class BatchNormNoReshape(_BatchNormBase):
    """Subtracts the (C,) statistics without reshaping them to (1, C, 1): for (B, C, L)
    they broadcast against L."""

    def forward(self, x):
        dims = self.stats_dims(x)
        if self.training:
            mean, var = x.mean(dim=dims), self.batch_var(x, dims)
            self.update(mean, var, x.numel() // x.shape[1])
        else:
            mean, var = self.running_mean, self.running_var
        if x.dim() == 2:
            return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias
        y = (x - mean) / torch.sqrt(var + self.eps)
        return y * self.weight + self.bias


class BatchNormPlainAttributes(nn.Module):
    """Stores the running statistics as plain tensors, not buffers: they are not in the
    state_dict, so the reference's cannot be loaded (and .to(device) would not move them)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.running_mean = torch.zeros(num_features)
        self.running_var = torch.ones(num_features)

    def forward(self, x):
        raise RuntimeError("never reached")


class LayerNormCallsBuiltin(_LayerNormBase):
    """Calls the built-in F.layer_norm instead of writing the normalisation."""

    def forward(self, x):
        weight = self.weight if self.elementwise_affine else None
        bias = self.bias if self.elementwise_affine else None
        return nn.functional.layer_norm(x, self.normalized_shape, weight, bias, self.eps)


class LayerNormCastsToFloat32(_LayerNormBase):
    """Casts the input to float32 with `.float()`: the float64 weights promote the result
    back to float64, so only the precision (about 4 digits) gives it away."""

    def normalise(self, x):
        return super().normalise(x.float())


class BatchNormCallsBuiltin(_BatchNormBase):
    """Calls the built-in F.batch_norm instead of writing the normalisation."""

    def forward(self, x):
        return nn.functional.batch_norm(
            x,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            self.training,
            self.momentum,
            self.eps,
        )


class BatchNormBatchAndChannelAxes(_BatchNormBase):
    """For (B, C, L) inputs reduces over dims (0, 1), batch and channels (and never
    updates the running statistics for them)."""

    def forward(self, x):
        if x.dim() == 2:
            return super().forward(x)
        if self.training:
            mean, var = x.mean((0, 1)), x.var((0, 1), unbiased=False)
        else:
            mean, var = self.running_mean, self.running_var
        y = (x - mean) / torch.sqrt(var + self.eps)
        return y * self.weight.view(1, -1, 1) + self.bias.view(1, -1, 1)


CATALOGUE = [
    ("layer_norm", "calls F.layer_norm", LayerNormCallsBuiltin, "do not call the built-in"),
    ("layer_norm", "casts to float32", LayerNormCastsToFloat32, "float32 precision"),
    ("batch_norm", "calls F.batch_norm", BatchNormCallsBuiltin, "do not call the built-in"),
    ("batch_norm", "stats over dims (0, 1)", BatchNormBatchAndChannelAxes, "dims (0, 1)"),
    ("layer_norm", "unbiased variance", LayerNormUnbiased, "unbiased variance"),
    ("layer_norm", "eps outside sqrt", LayerNormEpsOutside, "eps is outside the square root"),
    ("layer_norm", "last axis only", LayerNormLastAxisOnly, "last axis only"),
    (
        "layer_norm",
        "mean of the rows' variances",
        LayerNormMeanOfRowVariances,
        "the mean of each row's variance",
    ),
    ("layer_norm", "token axis", LayerNormTokenAxis, "the tokens of a (B, T, D) input"),
    ("layer_norm", "batch axis", LayerNormBatchAxis, "that is BatchNorm"),
    ("layer_norm", "gamma/beta names", LayerNormGammaBeta, "missing: weight, bias"),
    ("layer_norm", "hard-coded eps", LayerNormHardcodedEps, "`eps` argument is ignored"),
    ("batch_norm", "unbiased normalisation", BatchNormUnbiased, "unbiased variance (N-1)"),
    (
        "batch_norm",
        "running stats in training",
        BatchNormRunningStatsInTraining,
        "in training mode the output is normalised with the running statistics",
    ),
    (
        "batch_norm",
        "updates in eval",
        BatchNormUpdatesInEval,
        "the running statistics are updated in eval mode too",
    ),
    ("batch_norm", "cumulative average", BatchNormCumulative, "a cumulative average"),
    ("batch_norm", "momentum ignored", BatchNormFixedMomentum, "`momentum` argument is ignored"),
    ("batch_norm", "eps ignored", BatchNormFixedEps, "the `eps` argument is ignored"),
    (
        "batch_norm",
        "running var biased",
        BatchNormRunningBiased,
        "updated with the biased variance",
    ),
    ("batch_norm", "momentum swapped", BatchNormMomentumSwapped, "wrong way round"),
    ("batch_norm", "batch stats in eval", BatchNormEvalUsesBatch, "eval mode still uses the batch"),
    ("batch_norm", "3-D stats over batch only", BatchNormOnlyBatchAxis, "dims (0, 2)"),
    ("batch_norm", "num_batches_tracked", BatchNormForgetsCounter, "num_batches_tracked"),
    ("batch_norm", "N = B in the correction", BatchNormCorrectionUsesBatchSize, "N = B·L values"),
    ("batch_norm", "(C,) statistics not reshaped", BatchNormNoReshape, "reshape the mean"),
    ("batch_norm", "plain tensor attributes", BatchNormPlainAttributes, "register_buffer"),
]


# ---------------------------------------------------------------- issue 24, round 3 (verdicts)
# Kept apart from CATALOGUE above; tests/test_verdicts_round3.py runs ROUND3.


class BatchNormUpdatesOutsideNoGrad(_BatchNormBase):
    """Updates the running statistics in place outside `torch.no_grad()`: with an input that
    requires grad the buffers join the autograd graph (they get a grad_fn), so
    copy.deepcopy(model) fails and a second backward through them fails."""

    def update(self, mean, var, n):
        m = self.momentum
        self.running_mean.mul_(1 - m).add_(m * mean)
        self.running_var.mul_(1 - m).add_(m * var * n / (n - 1))
        self.num_batches_tracked += 1


class BatchNormRebindsRunningStats(_BatchNormBase):
    """Rebinds the running statistics, `self.running_mean = (1 - m) * self.running_mean +
    m * mean`, outside `torch.no_grad()`: the new tensors carry a grad_fn."""

    def update(self, mean, var, n):
        m = self.momentum
        self.running_mean = (1 - m) * self.running_mean + m * mean
        self.running_var = (1 - m) * self.running_var + m * var * n / (n - 1)
        self.num_batches_tracked += 1


class LayerNormStatsUnderNoGrad(_LayerNormBase):
    """Computes the mean and variance under `torch.no_grad()` ("statistics need no
    gradient"): the output is right, but the gradient of x misses the terms that flow
    through the mean and the variance."""

    def normalise(self, x):
        with torch.no_grad():
            mean = x.mean(dim=self.dims(), keepdim=True)
            var = x.var(dim=self.dims(), keepdim=True, unbiased=False)
        return (x - mean) / torch.sqrt(var + self.eps)


class LayerNormForwardUnderNoGrad(_LayerNormBase):
    """Runs the whole forward under `torch.no_grad()`: nothing can be trained."""

    def forward(self, x):
        with torch.no_grad():
            return super().forward(x)


ROUND3 = [
    (
        "batch_norm",
        "running stats updated outside no_grad",
        BatchNormUpdatesOutsideNoGrad,
        "update them under torch.no_grad()",
    ),
    (
        "batch_norm",
        "running stats rebound outside no_grad",
        BatchNormRebindsRunningStats,
        "update them under torch.no_grad()",
    ),
    ("layer_norm", "statistics under no_grad", LayerNormStatsUnderNoGrad, "torch.no_grad()"),
    ("layer_norm", "forward under no_grad", LayerNormForwardUnderNoGrad, "torch.no_grad()"),
]
