"""Chapter 20's package pieces: `softcap`, and `qk_norm` / `softcap` / `final_softcap` in
`CausalSelfAttention` and `GPT` (contract: shared/DESIGN.md, Part VI).

Against Hugging Face with copied weights (float64): QK-norm = `Qwen3Attention`; soft-capped
attention = Gemma 2's attention (its `eager_attention_forward` with `softcap`) with
`query_pre_attn_scalar = Dh`. Then the properties: the cap's bounds, the cache, the
explicit path, the config, the errors.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from attention_course import GPT, CausalSelfAttention, RMSNorm, softcap
from attention_course.fused import AttentionMask, prepare_fused_mask

D, H, HKV = 32, 4, 2
DH = D // H


def _hf():
    return pytest.importorskip(
        "transformers", reason="transformers (the dev extra) is needed to compare with HF"
    )


def _hf_rope(rotary_cls, config, T: int):
    """(cos, sin) of Hugging Face's rotary embedding at positions 0 .. T-1, float64."""
    rotary = rotary_cls(config)
    x = torch.zeros(1, T, D, dtype=torch.float64)
    cos, sin = rotary(x, torch.arange(T)[None])
    return cos, sin


def _causal_additive(T: int) -> torch.Tensor:
    """HF's 4-D additive causal mask (0 where a query may attend, -inf elsewhere)."""
    keep = torch.ones(T, T, dtype=torch.bool).tril()
    mask = torch.zeros(T, T, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    return mask[None, None]  # (1, 1, T, T)


def _copy_projections(ours: CausalSelfAttention, hf) -> None:
    with torch.no_grad():
        ours.w_q.weight.copy_(hf.q_proj.weight)
        ours.w_k.weight.copy_(hf.k_proj.weight)
        ours.w_v.weight.copy_(hf.v_proj.weight)
        ours.w_o.weight.copy_(hf.o_proj.weight)


# --------------------------------------------------------------------------- softcap


def test_softcap_is_the_formula_and_keeps_shape_and_dtype():
    x = torch.linspace(-40, 40, 81, dtype=torch.float32).reshape(3, 27)
    y = softcap(x, 7.5)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert_close(y, 7.5 * torch.tanh(x / 7.5))


def test_softcap_bounds_its_output_by_cap():
    cap = 5.0
    x = torch.linspace(-1e4, 1e4, 200_001, dtype=torch.float64)
    y = softcap(x, cap)
    assert bool((y.abs() <= cap).all())  # floating point: tanh rounds to 1 far out
    inside = x.abs() <= 18 * cap  # before tanh rounds to 1 in float64 (about 19 cap)
    assert bool((y[inside].abs() < cap).all())
    assert bool((torch.diff(y) >= 0).all())  # monotone: the order of the logits is kept
    assert float(softcap(torch.tensor(1e6, dtype=torch.float64), cap)) == pytest.approx(cap)


def test_softcap_is_close_to_the_identity_for_small_inputs():
    cap = 30.0
    x = torch.linspace(-3, 3, 601, dtype=torch.float64)  # |x| <= cap / 10
    error = (softcap(x, cap) - x).abs()
    assert bool((error <= x.abs() ** 3 / (3 * cap**2) + 1e-15).all())  # tanh(u) >= u - u³/3
    # the docstring's number: x = cap / 10 loses about 0.33 % of itself
    loss = 1 - float(softcap(torch.tensor(3.0, dtype=torch.float64), cap)) / 3.0
    assert round(100 * loss, 2) == 0.33
    # and the gradient is 1 at 0, nearly 0 far beyond the cap
    x = torch.tensor([0.0, 10 * cap], dtype=torch.float64, requires_grad=True)
    softcap(x, cap).sum().backward()
    assert x.grad[0].item() == pytest.approx(1.0)
    assert x.grad[1].item() < 1e-7


@pytest.mark.parametrize("cap", [0, 0.0, -1.0, float("inf"), float("nan"), True, "5", None])
def test_softcap_rejects_a_cap_that_is_not_a_positive_number(cap):
    with pytest.raises(ValueError, match="cap"):
        softcap(torch.ones(3), cap)


def test_softcap_rejects_integer_tensors():
    with pytest.raises(ValueError, match="x"):
        softcap(torch.ones(3, dtype=torch.long), 5.0)


# ------------------------------------------------------------------ against Hugging Face


def test_qk_norm_equals_qwen3_attention():
    transformers = _hf()
    from transformers.models.qwen3 import modeling_qwen3

    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        hidden_size=D,
        num_attention_heads=H,
        num_key_value_heads=HKV,
        head_dim=DH,
        rms_norm_eps=1e-6,
        attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        num_hidden_layers=1,
        attn_implementation="eager",
    )
    hf = modeling_qwen3.Qwen3Attention(config, layer_idx=0).double().eval()
    ours = CausalSelfAttention(D, H, num_kv_heads=HKV, pos="rope", qk_norm=True).double().eval()
    with torch.no_grad():
        for module in (hf.q_proj, hf.k_proj, hf.v_proj, hf.o_proj):
            module.weight.normal_(0, 0.3)
        # random norm gains: with gains of 1, normalising after RoPE (a rotation, which keeps
        # each vector's norm) would give the same output and the test could not tell
        hf.q_norm.weight.uniform_(0.5, 1.5)
        hf.k_norm.weight.uniform_(0.5, 1.5)
        ours.q_norm.weight.copy_(hf.q_norm.weight)
        ours.k_norm.weight.copy_(hf.k_norm.weight)
    _copy_projections(ours, hf)
    T = 9
    x = torch.randn(2, T, D, dtype=torch.float64)
    cos, sin = _hf_rope(modeling_qwen3.Qwen3RotaryEmbedding, config, T)
    expected, _ = hf(x, position_embeddings=(cos, sin), attention_mask=_causal_additive(T))
    # HF computes cos/sin in float32: agreement to ~1e-7, not to float64's last digit
    assert_close(ours(x), expected, atol=1e-6, rtol=1e-6)
    _, weights = ours(x, need_weights=True)
    assert weights.shape == (2, H, T, T)
    # and the norms matter here: without them the output is far from HF's
    plain = CausalSelfAttention(D, H, num_kv_heads=HKV, pos="rope").double().eval()
    _copy_projections(plain, hf)
    assert (plain(x) - expected).abs().max() > 1e-2


@pytest.mark.parametrize("need_weights", [False, True])
def test_softcap_equals_gemma2_eager_attention(need_weights):
    transformers = _hf()
    from transformers.models.gemma2 import modeling_gemma2

    torch.manual_seed(1)
    cap = 2.0  # small, so that many scores reach it
    config = transformers.Gemma2Config(
        hidden_size=D,
        num_attention_heads=H,
        num_key_value_heads=HKV,
        head_dim=DH,
        query_pre_attn_scalar=DH,  # the scores scaled by Dh^-1/2, as ours
        attn_logit_softcapping=cap,
        attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        num_hidden_layers=1,
        layer_types=["full_attention"],
        attn_implementation="eager",
    )
    hf = modeling_gemma2.Gemma2Attention(config, layer_idx=0).double().eval()
    assert hf.config._attn_implementation == "eager"  # Gemma 2's eager_attention_forward
    assert modeling_gemma2.Gemma2PreTrainedModel._supports_sdpa is False  # the docstring's fact
    with torch.no_grad():
        for module in (hf.q_proj, hf.k_proj, hf.v_proj, hf.o_proj):
            module.weight.normal_(0, 0.5)
    ours = CausalSelfAttention(D, H, num_kv_heads=HKV, pos="rope", softcap=cap).double().eval()
    _copy_projections(ours, hf)
    T = 10
    x = torch.randn(2, T, D, dtype=torch.float64)
    cos, sin = _hf_rope(modeling_gemma2.Gemma2RotaryEmbedding, config, T)
    expected, hf_weights = hf(x, position_embeddings=(cos, sin), attention_mask=_causal_additive(T))
    got = ours(x, need_weights=need_weights)
    if need_weights:
        got, weights = got
        # HF's softmax runs in float32 even for float64 inputs
        assert_close(weights, hf_weights, atol=1e-6, rtol=1e-6)
    assert_close(got, expected, atol=1e-6, rtol=1e-6)
    # the cap is active here: many scaled scores exceed it, and without it the output differs
    uncapped = CausalSelfAttention(D, H, num_kv_heads=HKV, pos="rope").double().eval()
    _copy_projections(uncapped, hf)
    assert (uncapped(x) - expected).abs().max() > 1e-2


# ------------------------------------------------------------ the attention module itself


def test_qk_norm_attributes_are_one_rms_norm_over_dh_each_for_q_and_k():
    attn = CausalSelfAttention(D, H, num_kv_heads=HKV, qk_norm=True)
    for norm in (attn.q_norm, attn.k_norm):
        assert isinstance(norm, RMSNorm)
        assert norm.normalized_shape == (DH,) and norm.eps == 1e-6
    assert attn.q_norm is not attn.k_norm
    keys = set(attn.state_dict())
    assert {"q_norm.weight", "k_norm.weight"} <= keys
    plain = CausalSelfAttention(D, H)
    assert plain.q_norm is None and plain.k_norm is None
    assert not any("norm" in k for k in plain.state_dict())


def test_qk_norm_normalises_each_head_before_rope():
    """Each head's query has rms 1 (gains 1) after the norm; the rotation keeps it."""
    torch.manual_seed(2)
    attn = CausalSelfAttention(D, H, pos="rope", qk_norm=True).double()
    seen = {}
    attn.q_norm.register_forward_hook(lambda m, i, o: seen.setdefault("q", o))
    attn(torch.randn(1, 5, D, dtype=torch.float64) * 10)
    q = seen["q"]
    assert q.shape == (1, H, 5, DH)  # applied per head, over Dh
    assert_close(q.pow(2).mean(-1), torch.ones(1, H, 5, dtype=torch.float64), atol=1e-5, rtol=0)


def _mask_cases(T: int):
    keep = torch.ones(T, T, dtype=torch.bool).tril()
    keep[2] = False  # a query that may attend to nothing: zero output, on both paths
    return keep


def test_a_huge_cap_gives_the_fused_paths_output_for_every_mask_type():
    """The explicit (soft-capped) path equals the fused one when the cap does nothing, for a
    bool mask, an AttentionMask and a FusedMask (with a fully masked row)."""
    torch.manual_seed(3)
    fused = CausalSelfAttention(D, H, num_kv_heads=HKV, pos="rope").double().eval()
    capped = CausalSelfAttention(D, H, num_kv_heads=HKV, pos="rope", softcap=1e9).double().eval()
    capped.load_state_dict(fused.state_dict())
    T = 6
    x = torch.randn(2, T, D, dtype=torch.float64)
    keep = _mask_cases(T)
    expected = fused(x, mask=keep)
    assert bool((expected[:, 2] == 0).all())
    for mask in (keep, AttentionMask(keep), prepare_fused_mask(keep, torch.float64)):
        assert_close(capped(x, mask=mask), expected)
    assert_close(capped(x), fused(x))


def test_softcap_never_calls_the_fused_kernel(monkeypatch):
    import torch.nn.functional as F

    def refuse(*args, **kwargs):
        raise AssertionError("the fused kernel ran")

    x = torch.randn(1, 4, D)
    monkeypatch.setattr(F, "scaled_dot_product_attention", refuse)
    with pytest.raises(AssertionError, match="fused kernel ran"):
        CausalSelfAttention(D, H)(x)  # the patch is seen: the uncapped module uses it
    out = CausalSelfAttention(D, H, softcap=5.0)(x)
    assert out.shape == (1, 4, D)
    GPT(11, d_model=D, num_heads=H, num_layers=1, pos="rope", softcap=5.0)(torch.zeros(1, 3).long())


def test_softcap_is_applied_before_the_mask():
    """Hidden keys keep weight 0 (capping after the mask would turn -inf into -cap), and the
    weights are the softmax of the capped scores."""
    torch.manual_seed(4)
    attn = CausalSelfAttention(D, H, softcap=1.5).double().eval()
    x = torch.randn(1, 7, D, dtype=torch.float64) * 3
    _, weights = attn(x, need_weights=True)
    assert bool((weights.triu(1) == 0).all())
    assert_close(weights.sum(-1), torch.ones(1, H, 7, dtype=torch.float64))
    q = attn.w_q(x).view(1, 7, H, DH).transpose(1, 2)
    k = attn.w_k(x).view(1, 7, H, DH).transpose(1, 2)
    scores = softcap(q @ k.transpose(-2, -1) / math.sqrt(DH), 1.5)
    scores = scores.masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(), float("-inf"))
    assert_close(weights, torch.softmax(scores, -1))


def test_softcap_attention_trains_with_dropout():
    torch.manual_seed(5)
    attn = CausalSelfAttention(D, H, dropout=0.5, softcap=3.0).train()
    x = torch.randn(2, 5, D, requires_grad=True)
    out = attn(x)
    assert not torch.allclose(out, attn(x))  # dropout is on
    out.sum().backward()
    assert x.grad is not None and bool(x.grad.abs().sum() > 0)
    attn.eval()
    assert_close(attn(x), attn(x))


def test_softcap_with_alibi_is_refused():
    with pytest.raises(ValueError, match="softcap.*alibi"):
        CausalSelfAttention(D, H, pos="alibi", softcap=5.0)
    with pytest.raises(ValueError, match="softcap.*alibi"):
        GPT(11, d_model=D, num_heads=H, num_layers=1, pos="alibi", softcap=5.0)
    CausalSelfAttention(D, H, pos="alibi", qk_norm=True)  # QK-norm is fine with ALiBi


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(qk_norm=1), "qk_norm"),
        (dict(qk_norm="yes"), "qk_norm"),
        (dict(softcap=0.0), "softcap"),
        (dict(softcap=-2), "softcap"),
        (dict(softcap=float("nan")), "softcap"),
        (dict(final_softcap=0), "final_softcap"),
        (dict(final_softcap="30"), "final_softcap"),
    ],
)
def test_invalid_options_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}"):
        GPT(11, d_model=D, num_heads=H, num_layers=1, pos="rope", **kwargs)
    if name != "final_softcap":
        with pytest.raises(ValueError, match=f"^{name}"):
            CausalSelfAttention(D, H, **kwargs)


# --------------------------------------------------------------------------- the GPT

OPTIONS = [
    dict(pos="rope", qk_norm=True),
    dict(pos="rope", qk_norm=True, softcap=2.0, num_kv_heads=2),
    dict(pos="rope", qk_norm=True, softcap=2.0, window=4, final_softcap=3.0),
    dict(pos="learned", softcap=1.0, num_kv_heads=1),
    dict(pos="alibi", qk_norm=True, window=3),
]


@pytest.mark.parametrize(
    "options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items())
)
def test_cached_steps_equal_the_full_pass(options):
    torch.manual_seed(6)
    model = GPT(20, d_model=D, num_heads=H, num_layers=2, max_len=64, **options).double().eval()
    with torch.no_grad():  # make the caps and the norms' gains matter
        for p in model.parameters():
            p.mul_(5) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    ids = torch.randint(0, 20, (2, 12))
    full = model(ids)
    cache = model.new_cache()
    steps = [model(ids[:, :5], cache=cache)]
    steps += [model(ids[:, t : t + 1], cache=cache) for t in range(5, 12)]
    assert_close(torch.cat(steps, dim=1), full)
    changed = ids.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 20
    assert_close(model(changed)[:, :7], full[:, :7])  # the future does not leak


def test_gpt_passes_the_options_to_every_layer_and_round_trips_its_config():
    model = GPT(
        11, d_model=D, num_heads=H, num_layers=2, pos="rope", qk_norm=True, softcap=4.0,
        final_softcap=20.0,
    )  # fmt: skip
    for block in model.blocks:
        assert block.attn.qk_norm is True and block.attn.softcap == 4.0
        assert isinstance(block.attn.q_norm, RMSNorm)
    config = model.config()
    assert (config["qk_norm"], config["softcap"], config["final_softcap"]) == (True, 4.0, 20.0)
    rebuilt = GPT(**config)
    assert rebuilt.config() == config
    rebuilt.load_state_dict(model.state_dict())  # same keys and shapes
    ids = torch.randint(0, 11, (1, 6))
    assert_close(rebuilt(ids), model(ids))
    default = GPT(11, d_model=D, num_heads=H, num_layers=1).config()
    assert (default["qk_norm"], default["softcap"], default["final_softcap"]) == (
        False,
        None,
        None,
    )


def test_final_softcap_caps_the_logits_as_gemma2():
    torch.manual_seed(7)
    plain = GPT(11, d_model=D, num_heads=H, num_layers=1, pos="rope").double().eval()
    capped = GPT(11, d_model=D, num_heads=H, num_layers=1, pos="rope", final_softcap=0.05)
    capped = capped.double().eval()
    capped.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 11, (2, 8))
    logits = plain(ids)
    assert logits.abs().max() > 0.05  # the cap is active
    # Gemma2ForCausalLM: logits / cap, tanh, * cap
    assert_close(capped(ids), torch.tanh(logits / 0.05) * 0.05)
    assert bool((capped(ids).abs() < 0.05).all())
