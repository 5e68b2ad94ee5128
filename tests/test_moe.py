"""Chapter 21's package pieces: `MoE` and `load_balancing_loss` (contract: shared/DESIGN.md,
Part VI).

Against Hugging Face with copied weights: `MixtralSparseMoeBlock` (transformers 5.24 stores
its experts fused, as 3-D parameters: `gate_up_proj (E, 2F, D)`, gate rows first, and
`down_proj (E, D, F)`) and `load_balancing_loss_func` (no attention mask). Then the
properties: equal router logits with top_k = E give the experts' mean, shared experts are
added to every token, routing is per token, gradients reach the router, the errors.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from attention_course import MoE, SwiGLU, load_balancing_loss


def _mixtral():
    pytest.importorskip(
        "transformers", reason="transformers (the dev extra) is needed to compare with HF"
    )
    from transformers.models.mixtral import modeling_mixtral

    return modeling_mixtral


def _hf_block(modeling, D, F, E, k):
    from transformers import MixtralConfig

    config = MixtralConfig(
        hidden_size=D,
        intermediate_size=F,
        num_local_experts=E,
        num_experts_per_tok=k,
        router_jitter_noise=0.0,
        hidden_act="silu",
        experts_implementation="eager",  # the per-expert loop, on any machine
    )
    return modeling.MixtralSparseMoeBlock(config).double().eval()


def _copy_into_hf(ours: MoE, hf) -> None:
    """Our SwiGLU experts -> HF's fused 3-D expert parameters."""
    with torch.no_grad():
        hf.gate.weight.copy_(ours.router.weight)  # (E, D)
        for e, expert in enumerate(ours.experts):
            # gate_up_proj[e] (2F, D): the gate (our w1) rows, then the up (our w3) rows
            hf.experts.gate_up_proj[e].copy_(torch.cat([expert.w1.weight, expert.w3.weight]))
            hf.experts.down_proj[e].copy_(expert.w2.weight)  # (D, F)


@pytest.mark.parametrize("E, k", [(5, 2), (7, 1), (7, 3), (3, 3)])
def test_moe_equals_mixtral_sparse_moe_block(E, k):
    modeling = _mixtral()
    D, F = 12, 20
    torch.manual_seed(E * 10 + k)
    ours = MoE(D, F, E, top_k=k).double().eval()
    with torch.no_grad():
        ours.router.weight.normal_(0, 1.0)  # decisive routing, far from ties
    hf = _hf_block(modeling, D, F, E, k)
    _copy_into_hf(ours, hf)
    x = torch.randn(3, 7, D, dtype=torch.float64)
    out, router_logits = ours(x)
    expected = hf(x)
    hf_logits, hf_weights, hf_experts = hf.gate(x.reshape(-1, D))
    assert out.shape == (3, 7, D) and router_logits.shape == (21, E)
    assert_close(router_logits, hf_logits)
    # HF takes the router's softmax in float32: agreement to ~1e-7
    assert_close(out, expected, atol=1e-6, rtol=1e-6)
    _, weights, chosen = ours.route(x.reshape(-1, D))
    assert torch.equal(chosen, hf_experts)
    assert_close(weights, hf_weights.double(), atol=1e-6, rtol=1e-6)
    assert_close(weights.sum(-1), torch.ones(21, dtype=torch.float64))


def test_the_hf_comparison_can_fail():
    """Weights not renormalised, or the softmax taken after the top-k, differ from Mixtral."""
    modeling = _mixtral()
    D, F, E, k = 12, 20, 6, 2
    torch.manual_seed(0)
    ours = MoE(D, F, E, top_k=k).double().eval()
    hf = _hf_block(modeling, D, F, E, k)
    _copy_into_hf(ours, hf)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    expected = hf(x)
    tokens = x.reshape(-1, D)
    probs = torch.softmax(ours.router(tokens), -1)
    top, idx = probs.topk(k, -1)
    experts = torch.stack([expert(tokens) for expert in ours.experts], 1)  # (N, E, D)
    picked = experts.gather(1, idx[..., None].expand(-1, -1, D))  # (N, k, D)
    unnormalised = (top[..., None] * picked).sum(1).reshape(2, 5, D)
    assert (unnormalised - expected).abs().max() > 1e-3
    normalised = (top[..., None] / top.sum(-1, keepdim=True)[..., None] * picked).sum(1)
    assert_close(normalised.reshape(2, 5, D), expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("E", [3, 5, 7])
@pytest.mark.parametrize("k", [1, 2])
def test_load_balancing_loss_equals_hf(E, k):
    modeling = _mixtral()
    torch.manual_seed(E + 100 * k)
    logits = torch.randn(37, E, dtype=torch.float64) * 2  # N = 37 tokens
    got = load_balancing_loss(logits, E, k)
    expected = modeling.load_balancing_loss_func((logits,), num_experts=E, top_k=k)
    assert got.dim() == 0
    assert_close(got, expected.to(got.dtype), atol=1e-6, rtol=1e-6)
    # several layers: HF pools their tokens, as our loss on the concatenation
    more = torch.randn(11, E, dtype=torch.float64)
    expected = modeling.load_balancing_loss_func((logits, more), num_experts=E, top_k=k)
    got = load_balancing_loss(torch.cat([logits, more]), E, k)
    assert_close(got, expected.to(got.dtype), atol=1e-6, rtol=1e-6)


def test_load_balancing_loss_from_the_definition():
    """E * sum_e f_e P_e with f counting every one of the k slots: the values for a small case
    worked by hand, and the mistakes it must not equal."""
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 2.0, 1.0], [0.0, 1.0, 2.0], [2.0, 0.0, 1.0]])
    probs = torch.softmax(logits, -1)
    P = probs.mean(0)
    # top-2 of each row: {0,1}, {1,2}, {2,1}, {0,2} -> counts (2, 3, 3) of 4 tokens
    f = torch.tensor([2.0, 3.0, 3.0]) / 4
    expected = 3 * (f * P).sum()
    got = load_balancing_loss(logits, 3, 2)
    assert_close(got, expected)
    first_slot_only = 3 * (torch.tensor([2.0, 1.0, 1.0]) / 4 * P).sum()
    assert abs(float(got - first_slot_only)) > 0.1
    assert abs(float(got - (f * P).sum())) > 0.1  # the factor E


def test_load_balancing_loss_at_balance_and_at_collapse():
    E = 5
    balanced = 10.0 * torch.eye(E, dtype=torch.float64)  # token i goes to expert i
    assert_close(load_balancing_loss(balanced, E, 1), torch.tensor(1.0, dtype=torch.float64))
    collapsed = torch.zeros(40, E, dtype=torch.float64)
    collapsed[:, 0] = 30.0  # every token on expert 0, with probability ~1
    assert float(load_balancing_loss(collapsed, E, 1)) == pytest.approx(E, rel=1e-6)


def test_load_balancing_loss_reaches_the_router_through_P():
    logits = torch.randn(20, 4, requires_grad=True)
    load_balancing_loss(logits, 4, 2).backward()
    assert logits.grad is not None and bool(logits.grad.abs().sum() > 0)


def test_equal_router_logits_with_top_k_all_experts_give_the_experts_mean():
    torch.manual_seed(1)
    E = 4
    moe = MoE(10, 16, E, top_k=E).double()
    with torch.no_grad():
        moe.router.weight.zero_()  # every logit 0: probabilities 1/E, all experts chosen
    x = torch.randn(2, 3, 10, dtype=torch.float64)
    out, router_logits = moe(x)
    assert bool((router_logits == 0).all())
    mean = torch.stack([expert(x) for expert in moe.experts]).mean(0)
    assert_close(out, mean)


def test_shared_experts_are_added_to_every_token():
    torch.manual_seed(2)
    D, F, E = 10, 8, 4
    moe = MoE(D, F, E, top_k=2, num_shared=2).double()
    assert isinstance(moe.shared, SwiGLU)
    assert moe.shared.w1.out_features == 2 * F  # num_shared experts fused: width 2F
    routed_only = MoE(D, F, E, top_k=2).double()
    state = {k: v for k, v in moe.state_dict().items() if not k.startswith("shared.")}
    routed_only.load_state_dict(state)
    x = torch.randn(2, 6, D, dtype=torch.float64)
    out, logits = moe(x)
    routed, routed_logits = routed_only(x)
    assert_close(out, routed + moe.shared(x))
    assert_close(logits, routed_logits)
    assert MoE(D, F, E).shared is None


def test_routing_is_per_token():
    """Shuffling the tokens (within and across sequences) shuffles the output the same way."""
    torch.manual_seed(3)
    moe = MoE(8, 12, 5, top_k=2).double()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    out, logits = moe(x)
    perm = torch.randperm(12)
    shuffled, shuffled_logits = moe(x.reshape(12, 8)[perm].reshape(3, 4, 8))
    assert_close(shuffled.reshape(12, 8), out.reshape(12, 8)[perm])
    assert_close(shuffled_logits, logits[perm])


def test_only_the_chosen_experts_run_and_gradients_reach_the_router():
    torch.manual_seed(4)
    moe = MoE(8, 12, 6, top_k=1)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[2, 0] = 10.0  # every token with x_0 > 0 prefers expert 2 strongly
    x = torch.randn(1, 9, 8).abs()  # x_0 > 0 everywhere: all tokens on expert 2
    out, _ = moe(x)
    out.sum().backward()
    for e, expert in enumerate(moe.experts):
        used = expert.w1.weight.grad is not None and bool(expert.w1.weight.grad.abs().sum() > 0)
        assert used == (e == 2)
    # top_k = 1: the renormalised weight is 1, so the router learns through the balancing
    # loss; with top_k = 2 the output itself depends on the router's probabilities
    moe2 = MoE(8, 12, 6, top_k=2)
    out2, logits2 = moe2(torch.randn(2, 5, 8))
    out2.sum().backward()
    assert bool(moe2.router.weight.grad.abs().sum() > 0)


def test_moe_parameter_counts_match_the_docstring():
    D, F, E, k, s = 16, 24, 6, 2, 1
    moe = MoE(D, F, E, top_k=k, num_shared=s)
    total = sum(p.numel() for p in moe.parameters())
    assert total == 3 * D * F * (E + s) + D * E


def test_moe_runs_in_bfloat16_with_float32_routing():
    torch.manual_seed(5)
    moe = MoE(8, 12, 4).to(torch.bfloat16)
    x = torch.randn(2, 3, 8, dtype=torch.bfloat16)
    out, logits = moe(x)
    assert out.dtype == torch.bfloat16 and logits.dtype == torch.bfloat16
    _, weights, _ = moe.route(x.reshape(-1, 8))
    assert weights.dtype == torch.float32


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(top_k=5), "top_k"),  # more than the 4 experts
        (dict(top_k=0), "top_k"),
        (dict(top_k=1.5), "top_k"),
        (dict(num_shared=-1), "num_shared"),
        (dict(num_shared=True), "num_shared"),
        (dict(num_experts=0), "num_experts"),
        (dict(d_ff=0), "d_ff"),
    ],
)
def test_moe_rejects_invalid_arguments(kwargs, name):
    args = dict(d_model=8, d_ff=12, num_experts=4) | kwargs
    with pytest.raises(ValueError, match=f"^{name}"):
        MoE(**args)


def test_moe_rejects_bad_inputs():
    moe = MoE(8, 12, 4)
    with pytest.raises(ValueError, match="^x"):
        moe(torch.randn(3, 8))  # 2-D
    with pytest.raises(ValueError, match="^x"):
        moe(torch.randn(1, 3, 7))  # wrong width
    with pytest.raises(ValueError, match="^x"):
        moe(torch.ones(1, 3, 8, dtype=torch.long))


@pytest.mark.parametrize(
    "logits, E, k, name",
    [
        (torch.randn(5, 4), 4, 5, "top_k"),
        (torch.randn(5, 4), 3, 2, "router_logits"),
        (torch.randn(2, 5, 4), 4, 2, "router_logits"),
        (torch.randn(0, 4), 4, 2, "router_logits"),
        (torch.ones(5, 4, dtype=torch.long), 4, 2, "router_logits"),
        (torch.randn(5, 4), 0, 1, "num_experts"),
    ],
)
def test_load_balancing_loss_rejects_bad_inputs(logits, E, k, name):
    with pytest.raises(ValueError, match=f"^{name}"):
        load_balancing_loss(logits, E, k)


def test_renormalised_top_k_equals_a_softmax_over_the_top_k_logits():
    """The docstring's identity: with the renormalisation, softmax-then-top-k and
    top-k-then-softmax give the same weights (they differ only without it)."""
    torch.manual_seed(6)
    moe = MoE(8, 12, 6, top_k=3).double()
    tokens = torch.randn(10, 8, dtype=torch.float64)
    logits, weights, chosen = moe.route(tokens)
    top_logits, top_idx = logits.topk(3, -1)
    assert torch.equal(top_idx, chosen)
    assert_close(weights, torch.softmax(top_logits, -1))
    unrenormalised = torch.softmax(logits, -1).gather(1, chosen)
    assert (unrenormalised - weights).abs().max() > 0.05
