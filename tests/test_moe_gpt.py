"""Chapter 21's glue: a GPT whose feed-forward networks are `MoE` layers (`ffn="moe"`), the
router logits it returns for the balancing loss, `active_parameters`, and DeepSeek-V3's
auxiliary-loss-free balancing bias (`MoE(..., router_bias=True)`, `update_router_bias`)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from attention_course import GPT, MoE, SwiGLU, active_parameters, load_balancing_loss

V = 23


def _moe_gpt(**kwargs):
    options = dict(d_model=16, num_heads=2, num_layers=2, max_len=32, pos="rope", norm="rms")
    options |= dict(ffn="moe", d_ff=12, num_experts=4, top_k=2) | kwargs
    return GPT(V, **options)


def test_a_moe_gpt_has_moe_blocks_and_returns_every_layers_router_logits():
    torch.manual_seed(0)
    model = _moe_gpt(num_shared=1)
    for block in model.blocks:
        assert isinstance(block.ffn, MoE) and isinstance(block.ffn.shared, SwiGLU)
        assert (block.ffn.num_experts, block.ffn.top_k, block.ffn.d_ff) == (4, 2, 12)
    ids = torch.randint(0, V, (3, 9))
    logits = model(ids)
    again, router_logits = model(ids, return_router_logits=True)
    assert logits.shape == (3, 9, V)
    assert_close(again, logits)
    assert len(router_logits) == 2 and all(r.shape == (27, 4) for r in router_logits)
    # layer 0's router logits are its router applied to its normalised input
    x = model.tok_emb(ids)
    block = model.blocks[0]
    h = x + block.attn(block.norm1(x))
    assert_close(router_logits[0], block.ffn.router(block.norm2(h)).reshape(27, 4))
    y = block(x)  # layer 1's input
    second = model.blocks[1]
    h = y + second.attn(second.norm1(y))
    assert_close(router_logits[1], second.ffn(second.norm2(h))[1])
    with_attention = model(ids, return_attention=True, return_router_logits=True)
    assert len(with_attention) == 3
    assert_close(with_attention[0], logits)
    assert len(with_attention[1]) == 2 and with_attention[1][0].shape == (3, 2, 9, 9)
    assert_close(with_attention[2][1], router_logits[1])


def test_the_balancing_loss_of_every_layer_reaches_every_router():
    torch.manual_seed(1)
    model = _moe_gpt()
    ids = torch.randint(0, V, (2, 10))
    logits, router_logits = model(ids, return_router_logits=True)
    aux = load_balancing_loss(torch.cat(router_logits), 4, 2)
    lm = F.cross_entropy(logits.reshape(-1, V), ids.reshape(-1))
    (lm + 0.01 * aux).backward()
    for block in model.blocks:
        assert bool(block.ffn.router.weight.grad.abs().sum() > 0)
        used = [e.w1.weight.grad is not None for e in block.ffn.experts]
        assert any(used)
    assert bool(model.tok_emb.weight.grad.abs().sum() > 0)


def test_a_moe_gpt_config_round_trips():
    torch.manual_seed(2)
    model = _moe_gpt(top_k=1, num_shared=2, router_bias=True)
    with torch.no_grad():
        for block in model.blocks:
            block.ffn.router_bias.copy_(torch.randn(4))
    config = model.config()
    assert {k: config[k] for k in ("ffn", "num_experts", "top_k", "num_shared", "router_bias")} == {
        "ffn": "moe",
        "num_experts": 4,
        "top_k": 1,
        "num_shared": 2,
        "router_bias": True,
    }
    rebuilt = GPT(**config)
    rebuilt.load_state_dict(model.state_dict())  # the bias travels in the state dict
    assert "blocks.0.ffn.router_bias" in model.state_dict()
    ids = torch.randint(0, V, (2, 7))
    assert_close(rebuilt(ids), model(ids))
    dense = GPT(V, d_model=16, num_heads=2, num_layers=1).config()
    assert (dense["num_experts"], dense["top_k"], dense["num_shared"], dense["router_bias"]) == (
        None,
        2,
        0,
        False,
    )


def test_a_moe_gpt_with_a_cache_equals_the_full_pass():
    """Routing is per token, so generating one token at a time routes each the same way."""
    torch.manual_seed(3)
    model = _moe_gpt().eval()
    ids = torch.randint(0, V, (2, 8))
    full = model(ids)
    cache = model.new_cache()
    steps = [model(ids[:, :5], cache=cache)] + [
        model(ids[:, t : t + 1], cache=cache) for t in range(5, 8)
    ]
    assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_every_expert_writes_into_the_residual_stream_with_the_residual_initialisation():
    torch.manual_seed(4)
    model = GPT(
        V, d_model=64, num_heads=2, num_layers=2, ffn="moe", d_ff=256, num_experts=3, num_shared=1
    )
    residual_std = 0.02 / math.sqrt(2 * 2)
    for block in model.blocks:
        for down in [e.w2 for e in block.ffn.experts] + [block.ffn.shared.w2]:
            assert float(down.weight.detach().std()) == pytest.approx(residual_std, rel=0.1)
        assert float(block.ffn.experts[0].w1.weight.detach().std()) == pytest.approx(0.02, rel=0.1)
        assert float(block.ffn.router.weight.detach().std()) == pytest.approx(0.02, rel=0.15)
    # d_ff defaults to the SwiGLU width, as ffn="swiglu"
    assert GPT(V, d_model=48, num_heads=2, num_layers=1, ffn="moe", num_experts=2).d_ff == 128


def test_active_parameters_leave_out_the_experts_a_token_skips():
    D, Fw, E, k, s, L = 16, 12, 4, 2, 1, 2
    model = _moe_gpt(num_shared=s)
    total = sum(p.numel() for p in model.parameters())
    per_expert = 3 * D * Fw
    assert active_parameters(model) == total - L * (E - k) * per_expert
    moe = MoE(D, Fw, E, top_k=k, num_shared=s)
    assert active_parameters(moe) == 3 * D * Fw * (k + s) + D * E
    dense = GPT(V, d_model=16, num_heads=2, num_layers=2, ffn="swiglu", d_ff=24)
    assert active_parameters(dense) == sum(p.numel() for p in dense.parameters())
    # top_k = E: every parameter is active
    assert active_parameters(MoE(D, Fw, 3, top_k=3)) == sum(
        p.numel() for p in MoE(D, Fw, 3, 3).parameters()
    )


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(ffn="moe"), "num_experts"),  # no number of experts
        (dict(ffn="swiglu", num_experts=4), "num_experts"),
        (dict(ffn="gelu", top_k=1), "top_k"),
        (dict(ffn="swiglu", num_shared=1), "num_shared"),
        (dict(ffn="swiglu", router_bias=True), "router_bias"),
        (dict(ffn="moe", num_experts=2, top_k=3), "top_k"),
        (dict(ffn="moe", num_experts=0), "num_experts"),
        (dict(ffn="moe", num_experts=4, router_bias=1), "router_bias"),
        (dict(ffn="mixture"), "ffn"),
    ],
)
def test_a_gpt_rejects_inconsistent_moe_options(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}"):
        GPT(V, d_model=16, num_heads=2, num_layers=1, **kwargs)


def test_router_logits_are_refused_without_a_router():
    model = GPT(V, d_model=16, num_heads=2, num_layers=1, ffn="swiglu")
    with pytest.raises(ValueError, match="^return_router_logits"):
        model(torch.zeros(1, 3, dtype=torch.long), return_router_logits=True)


# ------------------------------------------------------------ DeepSeek-V3's balancing bias
def _pair(seed=5, k=2, E=5):
    """An MoE with a bias and the same layer without one (same weights)."""
    torch.manual_seed(seed)
    with_bias = MoE(8, 12, E, top_k=k, router_bias=True).double()
    plain = MoE(8, 12, E, top_k=k).double()
    plain.load_state_dict({n: t for n, t in with_bias.state_dict().items() if n != "router_bias"})
    return with_bias, plain


def test_the_bias_is_a_buffer_not_a_parameter_and_starts_at_zero():
    moe = MoE(8, 12, 5, router_bias=True)
    assert moe.router_bias.shape == (5,) and bool((moe.router_bias == 0).all())
    assert all(p is not moe.router_bias for p in moe.parameters())
    assert "router_bias" in moe.state_dict()
    plain = MoE(8, 12, 5)
    assert plain.router_bias is None and "router_bias" not in plain.state_dict()


def test_a_zero_bias_changes_nothing():
    with_bias, plain = _pair()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    out, logits = with_bias(x)
    expected, expected_logits = plain(x)
    assert_close(out, expected)
    assert_close(logits, expected_logits)


def test_the_bias_changes_the_choice_but_not_the_weights():
    with_bias, plain = _pair()
    tokens = torch.randn(40, 8, dtype=torch.float64)
    with torch.no_grad():
        with_bias.router_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 50.0, 0.0]))
    logits, weights, chosen = with_bias.route(tokens)
    plain_logits, plain_weights, plain_chosen = plain.route(tokens)
    assert_close(logits, plain_logits)  # the logits themselves carry no bias
    assert bool((chosen == 3).any(dim=-1).all())  # every token now picks expert 3
    assert not torch.equal(chosen, plain_chosen)
    # the weights: the unbiased probabilities of the chosen experts, renormalised
    probs = torch.softmax(plain_logits, -1).gather(1, chosen)
    assert_close(weights, probs / probs.sum(-1, keepdim=True))
    biased = torch.softmax(plain_logits + with_bias.router_bias, -1).gather(1, chosen)
    assert (weights - biased / biased.sum(-1, keepdim=True)).abs().max() > 1e-3
    # the forward pass uses those weights on those experts
    x = tokens.reshape(5, 8, 8)
    out, _ = with_bias(x)
    every = torch.stack([e(tokens) for e in with_bias.experts], 1)  # (N, E, D)
    picked = every.gather(1, chosen[..., None].expand(-1, -1, 8))  # (N, k, D)
    assert_close(out.reshape(40, 8), (weights[..., None] * picked).sum(1))


def test_no_gradient_reaches_the_bias_and_the_router_still_learns():
    torch.manual_seed(6)
    moe = MoE(8, 12, 4, top_k=2, router_bias=True)
    with torch.no_grad():
        moe.router_bias.copy_(torch.tensor([0.3, -0.2, 0.1, 0.0]))
    out, logits = moe(torch.randn(2, 5, 8))
    (out.sum() + load_balancing_loss(logits, 4, 2)).backward()
    assert not moe.router_bias.requires_grad and moe.router_bias.grad is None
    assert bool(moe.router.weight.grad.abs().sum() > 0)


def test_expert_load_counts_the_choice_with_the_bias():
    moe = MoE(3, 4, 3, top_k=1, router_bias=True)
    logits = torch.tensor([[2.0, 0.5, 0.0], [2.0, 0.0, 0.5], [0.0, 2.0, 1.0], [2.0, 1.5, 0.0]])
    assert moe.expert_load(logits).tolist() == [3, 1, 0]
    with torch.no_grad():
        moe.router_bias.copy_(torch.tensor([-1.0, 0.0, 0.0]))
    assert moe.expert_load(logits).tolist() == [2, 2, 0]  # the last row moves to expert 1
    two = MoE(3, 4, 3, top_k=2)
    assert int(two.expert_load(torch.randn(10, 3)).sum()) == 20  # N · k


def test_update_router_bias_moves_each_expert_by_the_sign_of_its_load_error():
    moe = MoE(3, 4, 4, top_k=1, router_bias=True)
    # loads (4, 2, 2, 0) of 8 tokens: mean 2
    logits = torch.tensor([[5.0, 0, 0, 1]] * 4 + [[0, 5.0, 0, 0]] * 2 + [[0, 0, 5.0, 0]] * 2)
    load = moe.update_router_bias(logits, rate=0.25)
    assert load.tolist() == [4, 2, 2, 0]
    assert moe.router_bias.tolist() == [-0.25, 0.0, 0.0, 0.25]  # over: down; even: kept; under: up
    moe.update_router_bias(logits, rate=0.25)
    assert moe.router_bias.tolist() == [-0.5, 0.0, 0.0, 0.5]
    # it works towards balance: a large enough bias moves tokens off the busiest expert
    with torch.no_grad():
        moe.router_bias.copy_(torch.tensor([-6.0, 0.0, 0.0, 0.0]))
    assert moe.expert_load(logits).tolist() == [0, 2, 2, 4]


def test_update_router_bias_needs_a_bias_and_a_rate():
    logits = torch.randn(6, 4)
    with pytest.raises(ValueError, match="^router_bias"):
        MoE(3, 4, 4).update_router_bias(logits)
    for rate in (-0.1, float("nan"), "0.1", True):
        with pytest.raises(ValueError, match="^rate"):
            MoE(3, 4, 4, router_bias=True).update_router_bias(logits, rate)
    with pytest.raises(ValueError, match="^router_bias"):
        MoE(3, 4, 4, router_bias="yes")
