"""Buggy mixtures of experts and balancing losses (exercise 21): ``MoE(d_model, d_ff,
num_experts, top_k=2, num_shared=0)`` and ``load_balancing_loss(router_logits,
num_experts, top_k)``."""

import torch
import torch.nn.functional as F
from torch import nn

from attention_course import SwiGLU


class _MoEBase(nn.Module):
    """The contract's layout; ``weights_and_experts`` decides the routing."""

    def __init__(self, d_model, d_ff, num_experts, top_k=2, num_shared=0):
        super().__init__()
        self.top_k, self.num_experts = top_k, num_experts
        self.router = nn.Linear(d_model, num_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(d_model, d_ff) for _ in range(num_experts))
        self.shared = SwiGLU(d_model, num_shared * d_ff) if num_shared > 0 else None

    def weights(self, logits):  # (N, E) -> dense (N, E) weights, 0 outside the top-k
        probs = logits.softmax(-1)
        w, idx = probs.topk(self.top_k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        return torch.zeros_like(probs).scatter(-1, idx, w)

    def combine(self, tokens, out):
        return out + self.shared(tokens) if self.shared is not None else out

    def forward(self, x):
        B, T, D = x.shape
        tokens = x.reshape(B * T, D)
        logits = self.router(tokens)
        w = self.weights(logits)
        every = torch.stack([e(tokens) for e in self.experts], dim=1)  # (N, E, D)
        out = self.combine(tokens, (w[..., None] * every).sum(1))
        return out.reshape(B, T, D), logits


class MoESoftmaxOverTopK(_MoEBase):
    """Not a mistake: the softmax over the k largest logits equals the renormalised top-k
    probabilities (Mixtral's order and the other one agree; accepted)."""

    def weights(self, logits):
        top, idx = logits.topk(self.top_k, dim=-1)
        return torch.zeros_like(logits).scatter(-1, idx, top.softmax(-1))


class MoENotRenormalised(_MoEBase):
    """The top-k probabilities used as they are, not renormalised to sum 1."""

    def weights(self, logits):
        probs = logits.softmax(-1)
        w, idx = probs.topk(self.top_k, dim=-1)
        return torch.zeros_like(probs).scatter(-1, idx, w)


class MoEPerSequence(_MoEBase):
    """One choice of experts per sequence (from the mean probabilities over its tokens)."""

    def forward(self, x):
        B, T, D = x.shape
        logits = self.router(x)  # (B, T, E)
        probs = logits.softmax(-1)
        idx = probs.mean(1).topk(self.top_k, dim=-1).indices  # (B, k)
        keep = torch.zeros_like(probs).scatter(-1, idx[:, None].expand(B, T, self.top_k), 1.0)
        w = probs * keep
        w = w / w.sum(-1, keepdim=True)
        every = torch.stack([e(x) for e in self.experts], dim=2)  # (B, T, E, D)
        out = (w[..., None] * every).sum(2)
        if self.shared is not None:
            out = out + self.shared(x)
        return out, logits.reshape(B * T, -1)


class MoETopKOverTokens(_MoEBase):
    """topk(probs, k, dim=0): each expert picks its k tokens (expert choice)."""

    def weights(self, logits):
        probs = logits.softmax(-1)
        w, idx = probs.topk(self.top_k, dim=0)
        w = w / w.sum(0, keepdim=True)
        return torch.zeros_like(probs).scatter(0, idx, w)


class MoESoftmaxOverTokens(_MoEBase):
    """softmax(logits, dim=0): the probabilities run over the tokens."""

    def weights(self, logits):
        probs = logits.softmax(0)
        w, idx = probs.topk(self.top_k, dim=-1)
        return torch.zeros_like(probs).scatter(-1, idx, w / w.sum(-1, keepdim=True))


class MoESharedForgotten(_MoEBase):
    """The shared experts are built but never added."""

    def combine(self, tokens, out):
        return out


class MoESharedAveraged(_MoEBase):
    """(routed + shared) / 2."""

    def combine(self, tokens, out):
        return (out + self.shared(tokens)) / 2 if self.shared is not None else out


class MoERouterDetached(_MoEBase):
    """The routing weights computed from detached logits: the router never learns."""

    def weights(self, logits):
        return super().weights(logits.detach())


class MoEProbabilitiesReturned(_MoEBase):
    """Returns the router's probabilities as router_logits."""

    def forward(self, x):
        out, logits = super().forward(x)
        return out, logits.softmax(-1)


class MoELogitsNotFlattened(_MoEBase):
    """Returns router_logits as (B, T, E)."""

    def forward(self, x):
        out, logits = super().forward(x)
        return out, logits.reshape(x.shape[0], x.shape[1], -1)


class MoELogitsAsWeights(_MoEBase):
    """No softmax: the top-k router logits, renormalised, weight the experts."""

    def weights(self, logits):
        w, idx = logits.topk(self.top_k, dim=-1)
        return torch.zeros_like(logits).scatter(-1, idx, w / w.sum(-1, keepdim=True))


class MoEUniform(_MoEBase):
    """The k chosen experts averaged with weight 1/k each."""

    def weights(self, logits):
        idx = logits.topk(self.top_k, dim=-1).indices
        return torch.zeros_like(logits).scatter(-1, idx, 1.0 / self.top_k)


class MoEUnweighted(_MoEBase):
    """The k chosen experts' outputs summed without weights."""

    def weights(self, logits):
        idx = logits.topk(self.top_k, dim=-1).indices
        return torch.zeros_like(logits).scatter(-1, idx, 1.0)


class MoESharedGated(_MoEBase):
    """The shared output multiplied by the token's top-k probability mass."""

    def forward(self, x):
        B, T, D = x.shape
        tokens = x.reshape(B * T, D)
        logits = self.router(tokens)
        w = self.weights(logits)
        every = torch.stack([e(tokens) for e in self.experts], dim=1)
        out = (w[..., None] * every).sum(1)
        if self.shared is not None:
            mass = logits.softmax(-1).topk(self.top_k, dim=-1).values.sum(-1, keepdim=True)
            out = out + mass * self.shared(tokens)
        return out.reshape(B, T, D), logits


class MoESqueezed(_MoEBase):
    """squeeze(0) on the routing: harmless until N == 1, then the routing indices lose
    their token axis and the loop's unpacking breaks (one token, B = T = 1)."""

    def forward(self, x):
        B, T, D = x.shape
        tokens = x.reshape(-1, D)
        logits = self.router(tokens)
        w, idx = logits.softmax(-1).topk(self.top_k, -1)
        w = w / w.sum(-1, keepdim=True)
        w, idx = w.squeeze(0), idx.squeeze(0)  # does nothing unless N == 1
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(idx == e)
            out = out.index_add(0, token, w[token, slot, None] * expert(tokens[token]))
        if self.shared is not None:
            out = out + self.shared(tokens)
        return out.reshape(B, T, D), logits


class MoEPerSequenceMeanToken(_MoEBase):
    """One choice per sequence: the router applied to the sequence's mean token."""

    def forward(self, x):
        B, T, D = x.shape
        w = self.weights(self.router(x.mean(1)))  # (B, E)
        every = torch.stack([e(x) for e in self.experts], dim=2)  # (B, T, E, D)
        out = (w[:, None, :, None] * every).sum(2)
        if self.shared is not None:
            out = out + self.shared(x)
        return out, self.router(x.reshape(B * T, D))


class MoETopKOverTokensPerToken(_MoEBase):
    """topk(probs, k, dim=0), then each token's row renormalised (0 where no expert chose
    it)."""

    def weights(self, logits):
        probs = logits.softmax(-1)
        w, idx = probs.topk(self.top_k, dim=0)  # (k, E)
        gate = torch.zeros_like(probs).scatter(0, idx, w)
        return gate / gate.sum(-1, keepdim=True).clamp_min(1e-9)


class MoESharedTopWeight(_MoEBase):
    """The shared output multiplied by the token's largest renormalised weight, w[:, :1]."""

    def combine(self, tokens, out):
        if self.shared is None:
            return out
        w = self.weights(self.router(tokens))
        return out + w.max(-1, keepdim=True).values * self.shared(tokens)


class MoEFloat32Router(_MoEBase):
    """Not a wrong formula but against the statement: Mixtral's float32 softmax, the
    weights cast back to the input's dtype (float64 input: float32's precision)."""

    def weights(self, logits):
        probs = logits.float().softmax(-1)
        w, idx = probs.topk(self.top_k, dim=-1)
        w = (w / w.sum(-1, keepdim=True)).to(logits.dtype)
        return torch.zeros_like(logits).scatter(-1, idx, w)


def reference_balance_softmax_over_top_k(router_logits, num_experts, top_k):
    """Not a mistake: the package's formula written another way (accepted)."""
    probs = router_logits.softmax(-1)
    mask = torch.zeros_like(probs).scatter(-1, probs.topk(top_k, -1).indices, 1.0)
    return num_experts * (mask.mean(0) * probs.mean(0)).sum()


def _f_and_p(router_logits, num_experts, top_k):
    probs = router_logits.softmax(-1)
    idx = probs.topk(top_k, -1).indices
    f = F.one_hot(idx, num_experts).sum(1).to(probs.dtype).mean(0)
    return f, probs.mean(0), probs, idx


def balance_no_factor(router_logits, num_experts, top_k):
    """sum_e f_e P_e without the factor E."""
    f, P, _, _ = _f_and_p(router_logits, num_experts, top_k)
    return (f * P).sum()


def balance_first_slot(router_logits, num_experts, top_k):
    """f from each token's first choice only (argmax), as in Switch's top-1."""
    probs = router_logits.softmax(-1)
    f = F.one_hot(probs.argmax(-1), num_experts).to(probs.dtype).mean(0)
    return num_experts * (f * probs.mean(0)).sum()


def balance_p_from_top_k(router_logits, num_experts, top_k):
    """P averages the probabilities kept by the top-k only (zero elsewhere)."""
    f, _, probs, idx = _f_and_p(router_logits, num_experts, top_k)
    kept = torch.zeros_like(probs).scatter(-1, idx, probs.gather(-1, idx))
    return num_experts * (f * kept.mean(0)).sum()


def balance_f_over_assignments(router_logits, num_experts, top_k):
    """f divided by k: the fraction of the N * k assignments."""
    f, P, _, _ = _f_and_p(router_logits, num_experts, top_k)
    return num_experts * (f / top_k * P).sum()


def balance_counts(router_logits, num_experts, top_k):
    """f as counts (summed over the tokens), not fractions."""
    f, P, _, _ = _f_and_p(router_logits, num_experts, top_k)
    return num_experts * (f * router_logits.shape[0] * P).sum()


def balance_p_squared(router_logits, num_experts, top_k):
    """P used for f too: E * sum P^2."""
    _, P, _, _ = _f_and_p(router_logits, num_experts, top_k)
    return num_experts * (P * P).sum()


def balance_detached(router_logits, num_experts, top_k):
    """Computed on detached logits: the loss carries no gradient to the router."""
    f, P, _, _ = _f_and_p(router_logits.detach(), num_experts, top_k)
    return num_experts * (f * P).sum()


def balance_logits(router_logits, num_experts, top_k):
    """P averages the raw logits."""
    f, _, _, _ = _f_and_p(router_logits, num_experts, top_k)
    return num_experts * (f * router_logits.mean(0)).sum()


def balance_over_experts(router_logits, num_experts, top_k):
    """f and P averaged over the experts (dim=-1), one number per token."""
    probs = router_logits.softmax(-1)
    idx = probs.topk(top_k, -1).indices
    picked = F.one_hot(idx, num_experts).sum(1).to(probs.dtype)
    return num_experts * (picked.mean(-1) * probs.mean(-1)).sum()


def balance_f_squared(router_logits, num_experts, top_k):
    """f used for P too: E * sum f^2 (no gradient either)."""
    f, _, _, _ = _f_and_p(router_logits, num_experts, top_k)
    return num_experts * (f * f).sum()


def balance_sums(router_logits, num_experts, top_k):
    """f and P both summed over the tokens: N^2 times the loss."""
    f, _, probs, _ = _f_and_p(router_logits, num_experts, top_k)
    n = router_logits.shape[0]
    return num_experts * ((f * n) * probs.sum(0)).sum()


def balance_p_renormalised_top_k(router_logits, num_experts, top_k):
    """P from the MoE's expert weights: the top-k probabilities renormalised per token."""
    f, _, probs, idx = _f_and_p(router_logits, num_experts, top_k)
    kept = probs.gather(-1, idx)
    P = torch.zeros_like(probs).scatter(-1, idx, kept / kept.sum(-1, keepdim=True)).mean(0)
    return num_experts * (f * P).sum()


def balance_float32_mask(router_logits, num_experts, top_k):
    """Not a wrong formula but against the statement: Hugging Face's
    `one_hot(...).float().mean(0)`, a float32 f times the float64 P."""
    probs = router_logits.softmax(-1)
    idx = probs.topk(top_k, -1).indices
    f = F.one_hot(idx, num_experts).sum(1).float().mean(0)
    return num_experts * (f * probs.mean(0)).sum()


CATALOGUE = [
    ("moe", "not renormalised", MoENotRenormalised, "moe-weights-not-renormalised"),
    ("moe", "routing per sequence", MoEPerSequence, "moe-routing-per-sequence"),
    ("moe", "top-k over the tokens", MoETopKOverTokens, "moe-top-k-over-tokens"),
    ("moe", "softmax over the tokens", MoESoftmaxOverTokens, "moe-softmax-over-tokens"),
    ("moe", "shared forgotten", MoESharedForgotten, "moe-shared-forgotten"),
    ("moe", "shared averaged", MoESharedAveraged, "moe-shared-averaged"),
    ("moe", "router detached", MoERouterDetached, "moe-router-gets-no-gradient"),
    (
        "moe",
        "probabilities returned",
        MoEProbabilitiesReturned,
        "moe-router-probabilities-returned",
    ),
    ("moe", "logits (B, T, E)", MoELogitsNotFlattened, "moe-router-logits-not-flattened"),
    ("load_balancing_loss", "no factor E", balance_no_factor, "balance-factor-e-missing"),
    ("load_balancing_loss", "first slot only", balance_first_slot, "balance-first-slot-only"),
    ("load_balancing_loss", "P from the top-k", balance_p_from_top_k, "balance-p-from-top-k"),
    ("load_balancing_loss", "f / k", balance_f_over_assignments, "balance-f-divided-by-k"),
    ("load_balancing_loss", "counts", balance_counts, "balance-sum-over-tokens"),
    ("load_balancing_loss", "P for f", balance_p_squared, "balance-p-for-f"),
    ("load_balancing_loss", "detached", balance_detached, "balance-gets-no-gradient"),
    ("load_balancing_loss", "logits for P", balance_logits, "balance-logits-not-probabilities"),
    (
        "load_balancing_loss",
        "means over experts",
        balance_over_experts,
        "balance-mean-over-experts",
    ),
    ("load_balancing_loss", "f for P", balance_f_squared, "balance-f-for-p"),
    ("moe", "no softmax", MoELogitsAsWeights, "moe-no-router-softmax"),
    ("moe", "uniform 1/k", MoEUniform, "moe-uniform-expert-weights"),
    ("moe", "unweighted sum", MoEUnweighted, "moe-expert-outputs-unweighted"),
    ("moe", "shared gated", MoESharedGated, "moe-shared-weighted"),
    ("moe", "squeezed routing (one token)", MoESqueezed, None),
    ("moe", "per sequence (mean token)", MoEPerSequenceMeanToken, "moe-routing-per-sequence"),
    (
        "moe",
        "top-k over tokens, rows renormalised",
        MoETopKOverTokensPerToken,
        "moe-top-k-over-tokens",
    ),
    ("moe", "shared weighted by the top weight", MoESharedTopWeight, "moe-shared-weighted"),
    ("load_balancing_loss", "sums for means", balance_sums, "balance-sums-for-means"),
    (
        "load_balancing_loss",
        "P from the renormalised top-k",
        balance_p_renormalised_top_k,
        "balance-p-from-renormalised-top-k",
    ),
]
