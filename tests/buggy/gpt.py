"""Buggy CausalSelfAttention (exercise 13)."""

import math

import torch
import torch.nn.functional as F
from torch import nn


class CausalBase(nn.Module):
    """A correct causal self-attention from tensor operations; the subclasses break it."""

    def __init__(self, d_model, num_heads, bias=False, dropout=0.0, **later_options):
        super().__init__()
        self.num_heads = num_heads
        self.d_head = d_model // num_heads
        self.dropout = dropout
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def split(self, t):
        B, T, D = t.shape
        return t.view(B, T, self.num_heads, self.d_head).transpose(1, 2)

    def merge(self, t):
        B, H, T, Dh = t.shape
        return t.transpose(1, 2).reshape(B, T, H * Dh)

    def scale(self):
        return 1.0 / math.sqrt(self.d_head)

    def hidden(self, T, device):
        """True where key j is hidden from query i (j > i)."""
        return torch.ones(T, T, dtype=torch.bool, device=device).triu(diagonal=1)

    def weights(self, scores):
        scores = scores.masked_fill(self.hidden(scores.shape[-1], scores.device), float("-inf"))
        weights = scores.softmax(dim=-1)
        return F.dropout(weights, p=self.dropout, training=self.training)

    def forward(self, x):
        q, k, v = self.split(self.w_q(x)), self.split(self.w_k(x)), self.split(self.w_v(x))
        weights = self.weights(q @ k.transpose(-2, -1) * self.scale())
        return self.w_o(self.merge(weights @ v))


class CausalNoMask(CausalBase):
    """Forgets the causal mask: every token sees the whole sequence."""

    def hidden(self, T, device):
        return torch.zeros(T, T, dtype=torch.bool, device=device)


class CausalScalesByDModel(CausalBase):
    """Scales the scores by 1/sqrt(d_model) instead of 1/sqrt(d_head)."""

    def scale(self):
        return 1.0 / math.sqrt(self.num_heads * self.d_head)


class CausalMergeNoTranspose(CausalBase):
    """Merges (B, H, T, Dh) straight into (B, T, D) without the transpose."""

    def merge(self, t):
        B, H, T, Dh = t.shape
        return t.reshape(B, T, H * Dh)


class CausalHidesDiagonal(CausalBase):
    """Off by one: triu(diagonal=0) also hides the diagonal, so a token cannot see
    itself (and the first row is all -inf: NaN)."""

    def hidden(self, T, device):
        return torch.ones(T, T, dtype=torch.bool, device=device).triu(diagonal=0)


class CausalSeesNext(CausalBase):
    """Off by one: triu(diagonal=2) lets token t see token t + 1."""

    def hidden(self, T, device):
        return torch.ones(T, T, dtype=torch.bool, device=device).triu(diagonal=2)


class CausalMaskAfterSoftmax(CausalBase):
    """Zeroes the future weights after the softmax (rows no longer sum to 1)."""

    def weights(self, scores):
        weights = scores.softmax(dim=-1)
        weights = weights.masked_fill(self.hidden(scores.shape[-1], scores.device), 0.0)
        return F.dropout(weights, p=self.dropout, training=self.training)


class CausalInvertedMask(CausalBase):
    """Hides the past and keeps the future (tril(-1) instead of triu(1))."""

    def hidden(self, T, device):
        return torch.ones(T, T, dtype=torch.bool, device=device).tril(diagonal=-1)


class CausalNoDropout(CausalBase):
    """Ignores dropout in training mode."""

    def weights(self, scores):
        scores = scores.masked_fill(self.hidden(scores.shape[-1], scores.device), float("-inf"))
        return scores.softmax(dim=-1)


class CausalDropoutOnOutput(CausalBase):
    """Applies dropout to the output instead of the attention weights."""

    def weights(self, scores):
        scores = scores.masked_fill(self.hidden(scores.shape[-1], scores.device), float("-inf"))
        return scores.softmax(dim=-1)

    def forward(self, x):
        return F.dropout(super().forward(x), p=self.dropout, training=self.training)


class CausalDropoutInEval(CausalBase):
    """Applies dropout whatever the mode (training=True)."""

    def weights(self, scores):
        scores = scores.masked_fill(self.hidden(scores.shape[-1], scores.device), float("-inf"))
        return F.dropout(scores.softmax(dim=-1), p=self.dropout, training=True)


class CausalIgnoresBias(CausalBase):
    """Multiplies by the weight matrices only: the biases are never added."""

    def forward(self, x):
        def lin(layer, t):
            return t @ layer.weight.T

        q = self.split(lin(self.w_q, x))
        k = self.split(lin(self.w_k, x))
        v = self.split(lin(self.w_v, x))
        weights = self.weights(q @ k.transpose(-2, -1) * self.scale())
        return lin(self.w_o, self.merge(weights @ v))


class CausalUsesBuiltin(CausalBase):
    """Calls F.scaled_dot_product_attention(is_causal=True), which the task forbids."""

    def forward(self, x):
        q, k, v = self.split(self.w_q(x)), self.split(self.w_k(x)), self.split(self.w_v(x))
        p = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        return self.w_o(self.merge(out))


class CausalUnscaledDropout(CausalBase):
    """Drops attention weights but does not rescale the kept ones by 1 / (1 - p)."""

    def weights(self, scores):
        scores = scores.masked_fill(self.hidden(scores.shape[-1], scores.device), float("-inf"))
        weights = scores.softmax(dim=-1)
        if self.training and self.dropout > 0:
            weights = weights * (torch.rand_like(weights) >= self.dropout)
        return weights


class CausalDropoutKeepProbability(CausalBase):
    """Passes 1 - p to F.dropout, as if p were the probability of keeping."""

    def weights(self, scores):
        scores = scores.masked_fill(self.hidden(scores.shape[-1], scores.device), float("-inf"))
        p = 1 - self.dropout if self.dropout > 0 else 0.0
        return F.dropout(scores.softmax(dim=-1), p=p, training=self.training)


class CausalDropoutOnScores(CausalBase):
    """Applies dropout to the scores, before the mask and the softmax."""

    def weights(self, scores):
        scores = F.dropout(scores, p=self.dropout, training=self.training)
        scores = scores.masked_fill(self.hidden(scores.shape[-1], scores.device), float("-inf"))
        return scores.softmax(dim=-1)


class CausalDropoutOnValues(CausalBase):
    """Applies dropout to the values w_v(x) instead of the attention weights."""

    def weights(self, scores):
        scores = scores.masked_fill(self.hidden(scores.shape[-1], scores.device), float("-inf"))
        return scores.softmax(dim=-1)

    def forward(self, x):
        q, k = self.split(self.w_q(x)), self.split(self.w_k(x))
        v = self.split(F.dropout(self.w_v(x), p=self.dropout, training=self.training))
        weights = self.weights(q @ k.transpose(-2, -1) * self.scale())
        return self.w_o(self.merge(weights @ v))


class CausalDropoutOnMergedHeads(CausalBase):
    """Applies dropout to the merged heads, before w_o, instead of the attention weights."""

    def weights(self, scores):
        scores = scores.masked_fill(self.hidden(scores.shape[-1], scores.device), float("-inf"))
        return scores.softmax(dim=-1)

    def merge(self, t):
        return F.dropout(super().merge(t), p=self.dropout, training=self.training)


class CausalInterleavedHeads(CausalBase):
    """Splits the heads as view(B, T, Dh, H): head h gets features h, h + H, ..."""

    def split(self, t):
        B, T, D = t.shape
        return t.view(B, T, self.d_head, self.num_heads).permute(0, 3, 1, 2)

    def merge(self, t):
        B, H, T, Dh = t.shape
        return t.permute(0, 2, 3, 1).reshape(B, T, H * Dh)


class CausalValuesFromWk(CausalBase):
    """Projects the values with w_k."""

    def forward(self, x):
        q, k, v = self.split(self.w_q(x)), self.split(self.w_k(x)), self.split(self.w_k(x))
        weights = self.weights(q @ k.transpose(-2, -1) * self.scale())
        return self.w_o(self.merge(weights @ v))


class CausalValuesFromWq(CausalBase):
    """Projects the values with w_q (no named mistake: the T = 1 hint names the place)."""

    def forward(self, x):
        q, k, v = self.split(self.w_q(x)), self.split(self.w_k(x)), self.split(self.w_q(x))
        weights = self.weights(q @ k.transpose(-2, -1) * self.scale())
        return self.w_o(self.merge(weights @ v))


class CausalNoBiasLayers(CausalBase):
    """Builds the layers with bias=False whatever bias it is given."""

    def __init__(self, d_model, num_heads, bias=False, dropout=0.0):
        super().__init__(d_model, num_heads, bias=False, dropout=dropout)


CATALOGUE = [
    ("causal_self_attention", "no causal mask", CausalNoMask, "no-causal-mask"),
    (
        "causal_self_attention",
        "scale by sqrt(d_model)",
        CausalScalesByDModel,
        "scale-by-d-model",
    ),
    (
        "causal_self_attention",
        "merge without transpose",
        CausalMergeNoTranspose,
        "heads-merged-without-transpose",
    ),
    (
        "causal_self_attention",
        "mask hides the diagonal",
        CausalHidesDiagonal,
        "causal-mask-hides-diagonal",
    ),
    ("causal_self_attention", "mask sees the next token", CausalSeesNext, "causal-mask-sees-next"),
    (
        "causal_self_attention",
        "mask after the softmax",
        CausalMaskAfterSoftmax,
        "mask-after-softmax",
    ),
    ("causal_self_attention", "inverted mask", CausalInvertedMask, "causal-mask-inverted"),
    ("causal_self_attention", "dropout ignored", CausalNoDropout, "dropout-never-applied"),
    (
        "causal_self_attention",
        "dropout on the output",
        CausalDropoutOnOutput,
        "dropout-on-output",
    ),
    ("causal_self_attention", "dropout in eval", CausalDropoutInEval, "dropout-in-eval"),
    (
        "causal_self_attention",
        "dropout not rescaled",
        CausalUnscaledDropout,
        "dropout-unscaled",
    ),
    (
        "causal_self_attention",
        "dropout p as keep probability",
        CausalDropoutKeepProbability,
        "dropout-keep-probability",
    ),
    (
        "causal_self_attention",
        "dropout on the scores",
        CausalDropoutOnScores,
        "dropout-before-softmax",
    ),
    (
        "causal_self_attention",
        "dropout on the values",
        CausalDropoutOnValues,
        "dropout-elsewhere",
    ),
    (
        "causal_self_attention",
        "dropout on the merged heads",
        CausalDropoutOnMergedHeads,
        "dropout-elsewhere",
    ),
    ("causal_self_attention", "bias ignored", CausalIgnoresBias, "bias-unused"),
    (
        "causal_self_attention",
        "bias=True builds no bias",
        CausalNoBiasLayers,
        "bias-not-built",
    ),
    (
        "causal_self_attention",
        "interleaved head split",
        CausalInterleavedHeads,
        "heads-split-and-merged-interleaved",
    ),
    (
        "causal_self_attention",
        "values from w_k",
        CausalValuesFromWk,
        "values-from-w-k",
    ),
    (
        "causal_self_attention",
        "values from w_q",
        CausalValuesFromWq,
        "check the value projection",
    ),
    (
        "causal_self_attention",
        "merge without transpose, causality case",
        CausalMergeNoTranspose,
        "or your head merge mixes tokens",
    ),
    (
        "causal_self_attention",
        "built-in attention",
        CausalUsesBuiltin,
        "do not call `F.scaled_dot_product_attention`",
    ),
]


# ---------------------------------------------------------------- issue 24, round 3 (verdicts)
# Kept apart from CATALOGUE above; tests/test_verdicts_round3.py runs ROUND3.


class CausalDropoutOnMaskedScores(CausalBase):
    """Dropout on the scores after the mask: a dropped -inf becomes -inf * 0 = NaN."""

    def weights(self, scores):
        scores = scores.masked_fill(self.hidden(scores.shape[-1], scores.device), float("-inf"))
        scores = F.dropout(scores, p=self.dropout, training=self.training)
        return scores.softmax(dim=-1)


class CausalMaskInTrainingOnly(CausalBase):
    """Applies the causal mask only when `self.training`: eval mode sees the future."""

    def weights(self, scores):
        if self.training:
            hidden = self.hidden(scores.shape[-1], scores.device)
            scores = scores.masked_fill(hidden, float("-inf"))
        weights = scores.softmax(dim=-1)
        return F.dropout(weights, p=self.dropout, training=self.training)


ROUND3 = [
    (
        "causal_self_attention",
        "dropout on the masked scores",
        CausalDropoutOnMaskedScores,
        "dropout-on-masked-scores",
    ),
    (
        "causal_self_attention",
        "mask in training mode only",
        CausalMaskInTrainingOnly,
        "causal-mask-one-mode",
    ),
]


# Round 5 (a fresh student, set 13): tests/test_verdicts_round5.py runs it.


class CausalDropoutRenormalised(CausalBase):
    """Dropout on the weights after the softmax, then each row renormalised (w / w.sum):
    0 / 0 = NaN where every weight of a row was dropped (token 0 has one)."""

    def weights(self, scores):
        weights = super().weights(scores)
        return weights / weights.sum(dim=-1, keepdim=True)
