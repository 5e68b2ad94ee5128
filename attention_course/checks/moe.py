"""Checkers for the mixture of experts (chapter 21, exercise 21): ``MoE`` and
``load_balancing_loss``.

Routing picks the k largest of a token's E probabilities; an input with two nearly equal
probabilities at the k-th place would let rounding, not the student, decide the choice.
So every drawn input is redrawn (`_data.draw_until`) until each token's k-th and
(k+1)-th probabilities differ by at least `_MARGIN`: no tie can fail a correct solution.

Softmax over the E logits then top-k then renormalise gives the same weights as a softmax
over the k largest logits alone (e^{r_i} / sum_{top-k} e^{r_j} = p_i / sum_{top-k} p_j):
the checker accepts both orders, as it must.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attention_course import moe as ref_moe

from ._compare import expect_close, expect_grad, expect_tuple, fmt_shape
from ._data import draw_until, randn
from ._mistakes import says
from ._modules import ModulePair, backward_both, compare_param_grads
from ._runner import TRIVIAL, Case, CaseFailed, call_student, checker
from .logit_range import keep_float64_hint

_MARGIN = 1e-3  # the smallest gap between a token's k-th and (k+1)-th probability


def _clear_choice(probs: torch.Tensor, k: int) -> bool:
    """Whether every row's k-th and (k+1)-th largest probability differ by ``_MARGIN``."""
    if k >= probs.shape[-1]:
        return True
    top = probs.topk(k + 1, dim=-1).values  # (N, k + 1), largest first
    return bool((top[:, k - 1] - top[:, k] >= _MARGIN).all())


# ---------------------------------------------------------------- MoE


def _route(probs: torch.Tensor, k: int, *, renormalise=True, over="experts"):
    """(weights (N, E), zero outside the chosen experts) for ``probs (N, E)``."""
    if over == "tokens":  # each expert picks its k tokens (expert choice)
        values, index = probs.topk(k, dim=0)  # (k, E)
        if renormalise:
            values = values / values.sum(dim=0, keepdim=True)
        return torch.zeros_like(probs).scatter(0, index, values)
    if over == "tokens, per token":  # the same choice, renormalised over each token's row
        values, index = probs.topk(k, dim=0)  # (k, E)
        gate = torch.zeros_like(probs).scatter(0, index, values)
        if renormalise:  # a token no expert picked keeps weights 0
            gate = gate / gate.sum(dim=-1, keepdim=True).clamp_min(1e-9)
        return gate
    values, index = probs.topk(k, dim=-1)  # (N, k)
    if renormalise:
        values = values / values.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs).scatter(-1, index, values)


def _moe_variant(module, x: torch.Tensor, **mistake) -> torch.Tensor:
    """The reference MoE's output on ``x (B, T, D)`` with one mistake switched on (none:
    the right output)."""
    B, T, D = x.shape
    k = module.top_k
    tokens = x.reshape(B * T, D)
    logits = module.router(tokens)  # (N, E)
    probs = logits.softmax(dim=0 if mistake.get("softmax") == "tokens" else -1)
    if mistake.get("softmax") == "none":
        probs = logits
    if mistake.get("per_sequence") == "mean token":  # the router on each sequence's mean
        per_seq = module.router(x.mean(dim=1)).softmax(dim=-1)  # (B, E)
        weights = _route(per_seq, k)  # (B, E)
        weights = weights[:, None, :].expand(B, T, -1).reshape(B * T, -1)
    elif mistake.get("per_sequence"):
        per_seq = probs.reshape(B, T, -1)
        chosen = per_seq.mean(dim=1).topk(k, dim=-1).indices  # (B, k): one choice a sequence
        keep = torch.zeros_like(per_seq).scatter(-1, chosen[:, None, :].expand(B, T, k), 1.0)
        picked = per_seq * keep
        weights = (picked / picked.sum(dim=-1, keepdim=True)).reshape(B * T, -1)
    else:
        weights = _route(
            probs,
            k,
            renormalise=not mistake.get("unnormalised"),
            over=mistake.get("top_k_over", "experts"),
        )
    if mistake.get("expert_weights") == "uniform":
        weights = (weights != 0).to(weights.dtype) / k
    elif mistake.get("expert_weights") == "ones":
        weights = (weights != 0).to(weights.dtype)
    every = torch.stack([expert(tokens) for expert in module.experts], dim=1)  # (N, E, D)
    out = (weights[..., None] * every).sum(dim=1)  # (N, D)
    if module.shared is not None:
        shared = mistake.get("shared", "add")
        if shared == "add":
            out = out + module.shared(tokens)
        elif shared == "average":
            out = (out + module.shared(tokens)) / 2
        elif shared == "weighted":
            mass = probs.topk(k, dim=-1).values.sum(dim=-1, keepdim=True)  # (N, 1)
            out = out + mass * module.shared(tokens)
        elif shared == "top weight":  # the largest renormalised weight, w[:, :1]
            top = weights.max(dim=-1, keepdim=True).values  # (N, 1)
            out = out + top * module.shared(tokens)
    return out.reshape(B, T, D)


def _moe_mistakes(module, x):
    def variant(**mistake):
        return lambda: _moe_variant(module, x, **mistake)

    return [
        (says("moe-weights-not-renormalised"), variant(unnormalised=True)),
        (says("moe-no-router-softmax"), variant(softmax="none")),
        (says("moe-no-router-softmax"), variant(softmax="none", unnormalised=True)),
        (says("moe-softmax-over-tokens"), variant(softmax="tokens")),
        (says("moe-top-k-over-tokens"), variant(top_k_over="tokens")),
        (says("moe-top-k-over-tokens"), variant(top_k_over="tokens", unnormalised=True)),
        (says("moe-routing-per-sequence"), variant(per_sequence=True)),
        (says("moe-routing-per-sequence"), variant(per_sequence="mean token")),
        (says("moe-top-k-over-tokens"), variant(top_k_over="tokens, per token")),
        (says("moe-uniform-expert-weights"), variant(expert_weights="uniform")),
        (says("moe-expert-outputs-unweighted"), variant(expert_weights="ones")),
        (says("moe-shared-forgotten"), variant(shared="none")),
        (says("moe-shared-averaged"), variant(shared="average")),
        (says("moe-shared-weighted"), variant(shared="weighted")),
        (says("moe-shared-weighted"), variant(shared="top weight")),
    ]


def _moe_case(
    candidate,
    init: dict,
    shape: tuple[int, int],
    seed: int,
    *,
    dtype=torch.float64,
    train: bool | None = False,
    grad: bool = False,
):
    B, T = shape

    def run():
        pair = ModulePair(candidate, ref_moe.MoE, init=init, train=train)
        reference = pair.reference
        D, k = init["d_model"], init.get("top_k", 2)
        if dtype != torch.float64:
            call_student(pair.student.to, dtype, what=f"moe.to({dtype})")
            reference.to(dtype)

        def clear(x):
            """No tie at the k-th place, and (where the choice matters) a softmax over the
            tokens would choose other experts for some token: under every run seed."""
            with torch.no_grad():
                logits = reference.router(x.reshape(B * T, D))
                probs = logits.softmax(dim=-1)
                chosen = probs.topk(k, dim=-1).indices.sort(dim=-1).values
                over_tokens = logits.softmax(dim=0).topk(k, dim=-1).indices.sort(dim=-1).values
            shows = k == probs.shape[-1] or B * T == 1 or not torch.equal(chosen, over_tokens)
            return _clear_choice(probs, k) and shows

        x = draw_until(lambda name: randn(B, T, D, seed=name, dtype=dtype), clear, seed)
        got, expected = pair.call(x, what="moe(x)", arg_names=("x",), grad=grad)
        out, logits = expect_tuple(got, 2, "moe(x)", ("out", "router_logits"))
        want_out, want_logits = expected
        with torch.no_grad():
            mistakes = _moe_mistakes(reference, x)
        expect_close(
            out,
            want_out.detach(),
            "the output `out`",
            mistakes=mistakes,
            hints=[keep_float64_hint(want_out.detach())],
        )
        if isinstance(logits, torch.Tensor) and logits.dim() == 3:
            raise CaseFailed(
                says("moe-router-logits-not-flattened"), mistake="moe-router-logits-not-flattened"
            )
        with torch.no_grad():
            probabilities = [
                (says("moe-router-probabilities-returned"), lambda: want_logits.softmax(-1))
            ]
        expect_close(logits, want_logits.detach(), "`router_logits`", mistakes=probabilities)
        if grad:
            backward_both(out, want_out)
            router = getattr(pair.student, "router", None)
            weight = getattr(router, "weight", None)
            if isinstance(weight, torch.Tensor) and (
                weight.grad is None or not bool(weight.grad.abs().sum() > 0)
            ):
                raise CaseFailed(
                    says("moe-router-gets-no-gradient"), mistake="moe-router-gets-no-gradient"
                )
            compare_param_grads(pair.student, reference, "MoE")
            expect_grad(pair.mine[0].grad, pair.theirs[0].grad, "`x`")

    return run


def _moe_state(candidate):
    def run():
        init = {"d_model": 6, "d_ff": 5, "num_experts": 3, "top_k": 2, "num_shared": 2}
        student = call_student(candidate, what="MoE(6, 5, 3, top_k=2, num_shared=2)", **init)
        if not isinstance(student, torch.nn.Module):
            raise CaseFailed(f"MoE(...) did not build an nn.Module (got {type(student).__name__})")
        router = getattr(student, "router", None)
        if not isinstance(router, torch.nn.Linear) or router.bias is not None:
            raise CaseFailed("`router` should be a bias-free nn.Linear(d_model, num_experts)")
        if tuple(router.weight.shape) != (3, 6):
            raise CaseFailed(
                f"`router.weight` has shape {fmt_shape(router.weight.shape)}, expected (3, 6): "
                "nn.Linear(d_model, num_experts, bias=False)"
            )
        experts = getattr(student, "experts", None)
        if not isinstance(experts, torch.nn.ModuleList) or len(experts) != 3:
            raise CaseFailed("`experts` should be an nn.ModuleList of num_experts SwiGLU")
        shared = getattr(student, "shared", None)
        if not isinstance(shared, torch.nn.Module):
            raise CaseFailed(
                "`shared` should be one SwiGLU(d_model, num_shared * d_ff) when num_shared > 0"
            )
        width = getattr(getattr(shared, "w1", None), "out_features", None)
        if width != 10:
            raise CaseFailed(
                f"`shared` has width {width}, expected num_shared * d_ff = 10: one "
                "SwiGLU(d_model, num_shared * d_ff)"
            )
        none = call_student(candidate, 6, 5, 3, what="MoE(6, 5, 3)")
        if getattr(none, "shared", "missing") is not None:
            raise CaseFailed("with num_shared=0 (the default), `shared` should be None")

    return run


@checker("moe", "MoE")
def check_moe(candidate) -> list[Case]:
    """Check the class ``MoE(d_model, d_ff, num_experts, top_k=2, num_shared=0)``: softmax
    over the E router logits, top-k per token, the k weights renormalised, plus the shared
    experts; ``forward(x (B, T, D)) -> (out (B, T, D), router_logits (B*T, E))``."""
    base = {"d_model": 8, "d_ff": 6, "num_experts": 4}
    return [
        Case(
            "router, experts and shared: the contract's attributes",
            _moe_state(candidate),
            weight=TRIVIAL,
            support=True,
            covers=frozenset({"num_shared"}),
        ),
        Case(
            "B=2, T=5, D=8, E=4, top_k=2 (eval mode)",
            _moe_case(candidate, base, (2, 5), 2201),
            covers=frozenset({"B>1", "mode=eval", "dtype=float64"}),
        ),
        Case(
            "top_k=1 (Switch-style: the one weight renormalised to 1)",
            _moe_case(candidate, {**base, "top_k": 1}, (2, 4), 2211),
            covers=frozenset({"top_k", "top_k=1"}),
        ),
        Case(
            "top_k=E=3: every expert, weights the full softmax",
            _moe_case(candidate, {**base, "num_experts": 3, "top_k": 3}, (2, 3), 2221),
            covers=frozenset({"top_k", "top_k=E"}),
        ),
        Case(
            "one shared expert (num_shared=1), E=5, top_k=2",
            _moe_case(candidate, {**base, "num_experts": 5, "num_shared": 1}, (2, 4), 2231),
            covers=frozenset({"num_shared"}),
        ),
        Case(
            "two shared experts (num_shared=2), top_k=1, B=1",
            _moe_case(candidate, {**base, "top_k": 1, "num_shared": 2}, (1, 6), 2241),
            covers=frozenset({"num_shared", "B=1", "top_k"}),
        ),
        Case(
            "T=1, B=3: per token, not per sequence",
            _moe_case(candidate, {**base, "num_experts": 6}, (3, 1), 2251),
            covers=frozenset({"T=1"}),
        ),
        Case(
            "B=T=1: one token (a decoding step at batch 1), E=5, one shared",
            _moe_case(candidate, {**base, "num_experts": 5, "num_shared": 1}, (1, 1), 2291),
            covers=frozenset({"B=T=1"}),
        ),
        Case(
            "float32 module and input, E=6, top_k=3",
            _moe_case(
                candidate, {**base, "num_experts": 6, "top_k": 3}, (2, 4), 2261, dtype=torch.float32
            ),
            covers=frozenset({"dtype=float32", "top_k"}),
        ),
        Case(
            "training mode (no dropout, no jitter: the same output)",
            _moe_case(candidate, {**base, "num_shared": 1}, (2, 3), 2271, train=True),
            covers=frozenset({"mode=train", "num_shared"}),
        ),
        Case(
            "gradients reach the router, the experts, the shared expert and x",
            _moe_case(candidate, {**base, "num_shared": 1}, (2, 4), 2281, grad=True),
            covers=frozenset({"grad", "num_shared"}),
        ),
    ]


# ---------------------------------------------------------------- load_balancing_loss


def _balance(logits, E, k, **mistake):
    """E * sum_e f_e * P_e with one mistake switched on (none: the right value)."""
    probs = logits.softmax(dim=-1)
    chosen = probs.topk(k, dim=-1).indices  # (N, k)
    if mistake.get("first_slot"):
        chosen = chosen[:, :1]
    picked = F.one_hot(chosen, E).sum(dim=1).to(probs.dtype)  # (N, E)
    axis = -1 if mistake.get("over_experts") else 0
    f = picked.sum(dim=axis) if mistake.get("sum") else picked.mean(dim=axis)
    if mistake.get("f_by_k"):
        f = f / k
    p_source = probs
    if mistake.get("p") == "top-k":
        p_source = probs * (picked > 0)
    elif mistake.get("p") == "top-k renormalised":
        kept = probs * (picked > 0)
        p_source = kept / kept.sum(dim=-1, keepdim=True)
    elif mistake.get("p") == "logits":
        p_source = logits
    P = p_source.sum(dim=axis) if mistake.get("sum") == "both" else p_source.mean(dim=axis)
    if mistake.get("swap") == "P":
        f = P
    elif mistake.get("swap") == "f":
        P = f
    factor = 1 if mistake.get("no_factor") else E
    return factor * (f * P).sum()


def _balance_mistakes(logits, E, k):
    def variant(**mistake):
        return lambda: _balance(logits, E, k, **mistake)

    return [
        (says("balance-factor-e-missing"), variant(no_factor=True)),
        (says("balance-first-slot-only"), variant(first_slot=True)),
        (says("balance-p-from-top-k"), variant(p="top-k")),
        (says("balance-f-divided-by-k"), variant(f_by_k=True)),
        (says("balance-sum-over-tokens"), variant(sum=True)),
        (says("balance-sums-for-means"), variant(sum="both")),
        (says("balance-p-from-renormalised-top-k"), variant(p="top-k renormalised")),
        (says("balance-mean-over-experts"), variant(over_experts=True)),
        (says("balance-logits-not-probabilities"), variant(p="logits")),
        (says("balance-p-for-f"), variant(swap="P")),
        (says("balance-f-for-p"), variant(swap="f")),
        (says("balance-factor-e-missing"), variant(no_factor=True, first_slot=True)),
    ]


def _balance_case(
    candidate, N, E, k, seed, *, dtype=torch.float64, grad=False, skew=0.0, scale=1.5
):
    """Logits ``(N, E)`` of size ``scale``; ``skew`` adds to expert 0's logit (a router
    that sends most tokens to one expert)."""

    def run():
        def draw(name):
            logits = scale * randn(N, E, seed=name)
            logits[:, 0] += skew
            return logits.to(dtype)

        def usable(t):
            """A clear top-k, and (k < E) an uneven load: with every f_e = k / E the loss
            is k for any P that sums to 1, so a wrong P (renormalised top-k weights, say)
            would pass under some run seeds."""
            probs = t.double().softmax(-1)
            if not _clear_choice(probs, k):
                return False
            f = F.one_hot(probs.topk(k, dim=-1).indices, E).sum(dim=1).double().mean(dim=0)
            return k >= E or bool((f - k / E).abs().max() > 1e-9)

        logits = draw_until(draw, usable, seed)
        mine = logits.detach().clone().requires_grad_(grad)
        theirs = logits.detach().clone().requires_grad_(grad)
        want = ref_moe.load_balancing_loss(theirs, E, k)
        call = f"load_balancing_loss(router_logits {fmt_shape(logits.shape)}, {E}, {k})"
        got = call_student(candidate, mine, E, k, what=call, arg_names=("router_logits",))
        if isinstance(got, torch.Tensor) and got.numel() == 1 and got.dim() > 0:
            raise CaseFailed(
                f"{call} returned a tensor of shape {fmt_shape(got.shape)}: return a scalar "
                "(0-d) tensor, e.g. `(f * P).sum() * num_experts`"
            )
        with torch.no_grad():
            mistakes = _balance_mistakes(logits, E, k)
        expect_close(
            got,
            want.detach(),
            f"{call}",
            mistakes=mistakes,
            hints=[keep_float64_hint(want.detach())],
        )
        if grad:
            want.backward()
            if not got.requires_grad:
                raise CaseFailed(
                    says("balance-gets-no-gradient"), mistake="balance-gets-no-gradient"
                )
            call_student(got.backward, what="backpropagating through your loss")
            if mine.grad is None or not bool(mine.grad.abs().sum() > 0):
                raise CaseFailed(
                    says("balance-gets-no-gradient"), mistake="balance-gets-no-gradient"
                )
            expect_grad(mine.grad, theirs.grad, "`router_logits`")

    return run


@checker("load_balancing_loss")
def check_load_balancing_loss(candidate) -> list[Case]:
    """Check ``load_balancing_loss(router_logits (N, E), num_experts, top_k) -> scalar``:
    ``E * sum_e f_e * P_e``, f_e the fraction of tokens with e in their top-k, P_e the
    mean router probability."""
    return [
        Case(
            "N=12 tokens, E=4, top_k=2",
            _balance_case(candidate, 12, 4, 2, 2301),
            covers=frozenset({"dtype=float64", "top_k>1"}),
        ),
        Case(
            "top_k=1 (Switch Transformers' form), N=10, E=5",
            _balance_case(candidate, 10, 5, 1, 2311),
            covers=frozenset({"top_k=1"}),
        ),
        Case(
            "a router that prefers expert 0 (load far from even), N=16, E=4, top_k=2",
            _balance_case(candidate, 16, 4, 2, 2321, skew=2.0),
            covers=frozenset({"skewed"}),
        ),
        Case(
            "top_k=E=3: every token picks every expert (the loss is E * sum P = E)",
            _balance_case(candidate, 6, 3, 3, 2331),
            weight=TRIVIAL,
            support=True,
            covers=frozenset({"top_k=E"}),
        ),
        Case(
            "N=1: one token, E=6, top_k=2",
            _balance_case(candidate, 1, 6, 2, 2341),
            covers=frozenset({"N=1"}),
        ),
        Case(
            "float32 logits give a float32 loss, N=20, E=8, top_k=3",
            _balance_case(candidate, 20, 8, 3, 2351, dtype=torch.float32),
            covers=frozenset({"dtype=float32"}),
        ),
        Case(
            "the gradient reaches router_logits through P",
            _balance_case(candidate, 12, 4, 2, 2361, grad=True),
            covers=frozenset({"grad"}),
        ),
    ]
