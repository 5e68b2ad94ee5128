"""Multi-head latent attention (chapter 18): naive == absorbed, the latent cache, Hugging
Face's ``DeepseekV3Attention`` with copied weights, the RoPE layout trap, GPT with MLA."""

from __future__ import annotations

import pytest
import torch

from attention_course import GPT, MultiHeadLatentAttention, apply_rope, cache_per_token
from attention_course.latent import LatentCache

# (d_model, num_heads, kv_rank, keyword arguments)
CONFIGS = [
    (32, 4, 16, {}),  # defaults: d_nope = d_v = 8, d_rope = 4, no query compression
    (32, 4, 12, {"q_rank": 20}),  # queries compressed too
    (48, 3, 10, {"d_nope": 6, "d_rope": 8, "d_v": 5, "q_rank": 7}),  # every width its own
    (16, 1, 24, {"d_rope": 2}),  # one head, rank above d_model
]


def _mla(d_model, num_heads, kv_rank, kwargs, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    model = MultiHeadLatentAttention(d_model, num_heads, kv_rank, **kwargs).to(dtype)
    with torch.no_grad():  # RMSNorm weights away from ones, so a missing norm shows
        for norm in (model.kv_norm, getattr(model, "q_norm", None)):
            if norm is not None:
                norm.weight.uniform_(0.5, 1.5)
    return model.eval()


def _x(B, T, D, seed=1, dtype=torch.float64):
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _reference(model, x):
    """MLA written out from the paper's equations, one head at a time, positions 0 .. T-1."""
    B, T, _ = x.shape
    H, dn, dr, dv, r = model.num_heads, model.d_nope, model.d_rope, model.d_v, model.kv_rank
    if model.q_rank is None:
        q = x @ model.w_q.weight.T
    else:
        q = model.q_norm(x @ model.w_dq.weight.T) @ model.w_uq.weight.T
    kv_a = x @ model.w_dkv.weight.T
    c = model.kv_norm(kv_a[..., :r])  # (B, T, r)
    k_rope = apply_rope(kv_a[..., r:], base=model.rope_base)  # (B, T, dr), positions 0..T-1
    kv = c @ model.w_ukv.weight.T  # (B, T, H * (dn + dv))
    heads = []
    for h in range(H):
        qh = q[..., h * (dn + dr) : (h + 1) * (dn + dr)]
        qh = torch.cat([qh[..., :dn], apply_rope(qh[..., dn:], base=model.rope_base)], -1)
        kvh = kv[..., h * (dn + dv) : (h + 1) * (dn + dv)]
        kh = torch.cat([kvh[..., :dn], k_rope], -1)
        vh = kvh[..., dn:]
        scores = qh @ kh.transpose(-1, -2) / (dn + dr) ** 0.5  # (B, T, T)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        weights = scores.masked_fill(future, float("-inf")).softmax(-1)
        heads.append(weights @ vh)
    return torch.cat(heads, -1) @ model.w_o.weight.T


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("absorbed", [False, True])
def test_equals_the_equations(config, absorbed):
    model = _mla(*config)
    x = _x(2, 7, config[0])
    torch.testing.assert_close(model(x, absorbed=absorbed), _reference(model, x))


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("T", [1, 9])
def test_naive_equals_absorbed(config, T):
    model = _mla(*config)
    x = _x(3, T, config[0])
    naive, absorbed = model(x), model(x, absorbed=True)
    assert naive.shape == (3, T, config[0])
    torch.testing.assert_close(absorbed, naive, rtol=1e-10, atol=1e-12)


def test_naive_equals_absorbed_float32():
    model = _mla(64, 8, 32, {"q_rank": 24}, dtype=torch.float32)
    x = _x(2, 33, 64, dtype=torch.float32)
    torch.testing.assert_close(model(x, absorbed=True), model(x), rtol=0, atol=1e-5)


@pytest.mark.parametrize("config", CONFIGS[:3])
@pytest.mark.parametrize("absorbed", [False, True])
def test_cache_step_by_step_equals_full_pass(config, absorbed):
    model = _mla(*config)
    x = _x(2, 11, config[0])
    full = model(x)
    cache = model.new_cache()
    pieces, t = [], 0
    for n in (4, 1, 1, 3, 1, 1):  # a prompt, then single tokens and a chunk
        pieces.append(model(x[:, t : t + n], cache=cache, absorbed=absorbed))
        t += n
        assert cache.length == t
    torch.testing.assert_close(torch.cat(pieces, dim=1), full)


def test_cache_stores_exactly_the_latent_and_the_rotated_key():
    model = _mla(32, 4, 12, {"q_rank": 20})
    x = _x(2, 5, 32)
    cache = model.new_cache()
    assert isinstance(cache, LatentCache) and cache.length == 0 and cache.latent is None
    model(x, cache=cache)
    assert cache.length == 5
    # what it holds: the normalised latent and the rotary key, rotated at positions 0..4
    a, k_rope = (x @ model.w_dkv.weight.T).split([12, model.d_rope], dim=-1)
    torch.testing.assert_close(cache.latent, model.kv_norm(a))
    torch.testing.assert_close(cache.k_rope, apply_rope(k_rope))
    assert cache.latent.shape == (2, 5, 12) and cache.k_rope.shape == (2, 5, model.d_rope)
    # and nothing else: its only tensors are those two buffers
    tensors = {k: v for k, v in vars(cache).items() if isinstance(v, torch.Tensor)}
    assert sorted(tensors) == ["_k_rope", "_latent"]
    capacity = cache._latent.shape[1]
    assert cache.nbytes == 2 * capacity * (12 + model.d_rope) * 8  # float64
    # per token and layer: kv_rank + d_rope numbers, whatever the number of heads
    assert cache_per_token(kv_rank=12, d_rope=model.d_rope) == 12 + model.d_rope


def test_gradients_flow_to_every_parameter():
    for absorbed in (False, True):
        model = _mla(32, 4, 12, {"q_rank": 20}).train()
        model(_x(2, 6, 32), absorbed=absorbed).square().sum().backward()
        for name, p in model.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, (absorbed, name)


def test_future_tokens_do_not_change_the_past():
    model = _mla(32, 4, 12, {})
    x = _x(1, 8, 32)
    y = x.clone()
    y[:, 5:] = torch.randn(1, 3, 32, dtype=torch.float64)
    for absorbed in (False, True):
        a, b = model(x, absorbed=absorbed), model(y, absorbed=absorbed)
        torch.testing.assert_close(a[:, :5], b[:, :5])
        assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_attributes_and_defaults():
    m = MultiHeadLatentAttention(64, 8, 32)
    assert (m.d_nope, m.d_rope, m.d_v) == (8, 4, 8)
    assert m.w_q.weight.shape == (8 * 12, 64)
    assert not hasattr(m, "w_dq") and not hasattr(m, "q_norm") and not hasattr(m, "w_uq")
    assert m.w_dkv.weight.shape == (32 + 4, 64)
    assert m.kv_norm.weight.shape == (32,) and m.kv_norm.eps == 1e-6
    assert m.w_ukv.weight.shape == (8 * 16, 32)
    assert m.w_o.weight.shape == (64, 64)
    assert all(lin.bias is None for lin in m.modules() if isinstance(lin, torch.nn.Linear))
    m = MultiHeadLatentAttention(64, 8, 32, q_rank=16, eps=1e-5)
    assert m.w_dq.weight.shape == (16, 64) and m.q_norm.weight.shape == (16,)
    assert m.q_norm.eps == 1e-5 and m.w_uq.weight.shape == (96, 16)
    assert not hasattr(m, "w_q")


@pytest.mark.parametrize(
    "args, kwargs, name",
    [
        ((32, 4, 0), {}, "kv_rank"),
        ((32, 4, 8), {"q_rank": 0}, "q_rank"),
        ((32, 4, 8), {"d_rope": 3}, "d_rope"),  # odd
        ((24, 4, 8), {}, "d_rope"),  # default D / (2H) = 3: odd
        ((20, 8, 8), {}, "d_nope"),  # default D / H = 2.5: not an integer
        ((20, 8, 8), {"d_nope": 2, "d_v": 2}, "d_rope"),  # default 1.25
        ((32, 4, 8), {"d_v": 1.5}, "d_v"),
        ((32, 0, 8), {}, "num_heads"),
        ((32, 4, 8), {"rope_base": -1.0}, "base"),
    ],
)
def test_bad_arguments_name_themselves(args, kwargs, name):
    with pytest.raises(ValueError, match=name):
        MultiHeadLatentAttention(*args, **kwargs)


def test_bad_inputs_name_themselves():
    m = MultiHeadLatentAttention(32, 4, 8)
    with pytest.raises(ValueError, match="x"):
        m(torch.randn(2, 5, 16))
    with pytest.raises(ValueError, match="x"):
        m(torch.randn(5, 32))
    with pytest.raises(ValueError, match="x"):
        m(torch.ones(1, 2, 32, dtype=torch.long))
    with pytest.raises(ValueError, match="cache"):
        m(torch.randn(1, 2, 32), cache=object())
    with pytest.raises(ValueError, match="absorbed"):
        m(torch.randn(1, 2, 32), absorbed="yes")


def test_cache_per_token():
    assert cache_per_token(num_kv_heads=8, d_head=128) == 2 * 8 * 128  # GQA
    assert cache_per_token(num_kv_heads=1, d_head=64, dtype=torch.bfloat16) == 256  # MQA bytes
    # DeepSeek-V2's shape (kv_rank 512, d_rope 64): 576 numbers, 1,152 bytes in 16 bits
    assert cache_per_token(kv_rank=512, d_rope=64) == 576
    assert cache_per_token(kv_rank=512, d_rope=64, dtype=torch.float32) == 2304
    for kwargs in ({}, {"num_kv_heads": 2, "d_head": 8, "kv_rank": 4, "d_rope": 2}):
        with pytest.raises(ValueError, match="num_kv_heads"):
            cache_per_token(**kwargs)
    with pytest.raises(ValueError, match="d_head"):
        cache_per_token(num_kv_heads=2)
    with pytest.raises(ValueError, match="dtype"):
        cache_per_token(kv_rank=4, d_rope=2, dtype="float32")


# ---- Hugging Face's DeepseekV3Attention -------------------------------------------------


def interleave_order(Dh):
    """Chapter 14's order (0, Dh/2, 1, Dh/2 + 1, ...): ``x_half[..., order]`` is the
    interleaved layout of the half-split features ``x_half``."""
    half = torch.arange(Dh // 2)
    return torch.stack([half, half + Dh // 2], dim=1).flatten()


def _hf_attention(model, interleave):
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf

    config = transformers.DeepseekV3Config(
        hidden_size=model.d_model,
        num_attention_heads=model.num_heads,
        num_key_value_heads=model.num_heads,
        q_lora_rank=model.q_rank,
        kv_lora_rank=model.kv_rank,
        qk_nope_head_dim=model.d_nope,
        qk_rope_head_dim=model.d_rope,
        v_head_dim=model.d_v,
        rope_interleave=interleave,
        rope_parameters={"rope_type": "default", "rope_theta": model.rope_base},
        rms_norm_eps=1e-6,
        attention_bias=False,
        max_position_embeddings=64,
    )
    config._attn_implementation = "eager"
    attention = hf.DeepseekV3Attention(config, layer_idx=0).to(torch.float64).eval()
    rotary = hf.DeepseekV3RotaryEmbedding(config)
    return attention, rotary


def _copy_into_hf(model, attention, permute_rope=False):
    """Our weights into HF's; ``permute_rope``: the rotary rows in DeepSeek's interleaved
    layout (what a released checkpoint holds)."""
    H, dn, dr = model.num_heads, model.d_nope, model.d_rope
    order = interleave_order(dr) if permute_rope else torch.arange(dr)
    # query rows per head [q_nope | q_rope]; the rope part reordered
    q_rows = torch.cat([torch.arange(dn), dn + order])
    q_rows = torch.cat([h * (dn + dr) + q_rows for h in range(H)])
    kv_rows = torch.cat([torch.arange(model.kv_rank), model.kv_rank + order])
    with torch.no_grad():
        if model.q_rank is None:
            attention.q_proj.weight.copy_(model.w_q.weight[q_rows])
        else:
            attention.q_a_proj.weight.copy_(model.w_dq.weight)
            attention.q_a_layernorm.weight.copy_(model.q_norm.weight)
            attention.q_b_proj.weight.copy_(model.w_uq.weight[q_rows])
        attention.kv_a_proj_with_mqa.weight.copy_(model.w_dkv.weight[kv_rows])
        attention.kv_a_layernorm.weight.copy_(model.kv_norm.weight)
        attention.kv_b_proj.weight.copy_(model.w_ukv.weight)
        attention.o_proj.weight.copy_(model.w_o.weight)


def _run_hf(attention, rotary, x):
    B, T, _ = x.shape
    position_ids = torch.arange(T)[None].expand(B, T)
    cos, sin = rotary(x, position_ids)
    mask = torch.zeros(T, T, dtype=x.dtype).masked_fill(
        torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")
    )
    out, _ = attention(x, position_embeddings=(cos, sin), attention_mask=mask[None, None])
    return out


@pytest.mark.parametrize("config", CONFIGS[:3])
@pytest.mark.parametrize("absorbed", [False, True])
def test_equals_hugging_face_deepseek_v3_attention(config, absorbed):
    model = _mla(*config)
    attention, rotary = _hf_attention(model, interleave=False)
    _copy_into_hf(model, attention)
    x = _x(2, 9, config[0])
    # HF's eager softmax runs in float32 even for float64 inputs
    torch.testing.assert_close(
        model(x, absorbed=absorbed), _run_hf(attention, rotary, x), rtol=1e-5, atol=1e-6
    )


def test_hugging_face_interleaved_layout_needs_chapter_14s_permutation():
    model = _mla(32, 4, 12, {"q_rank": 20, "d_rope": 8})
    attention, rotary = _hf_attention(model, interleave=True)  # DeepSeek's released layout
    x = _x(2, 9, 32)
    ours = model(x)
    _copy_into_hf(model, attention)  # the trap: weights copied as they are
    wrong = _run_hf(attention, rotary, x)
    assert (wrong - ours).abs().max() > 1e-3  # runs, shapes fine, different function
    _copy_into_hf(model, attention, permute_rope=True)  # rope rows in the interleaved order
    torch.testing.assert_close(_run_hf(attention, rotary, x), ours, rtol=1e-5, atol=1e-6)


# ---- GPT with latent attention ----------------------------------------------------------


def _gpt(**kwargs):
    torch.manual_seed(0)
    options = dict(d_model=32, num_heads=4, num_layers=2, max_len=64, pos="rope")
    options.update(attention="mla", kv_rank=12)
    return GPT(40, **{**options, **kwargs}).double().eval()


def test_gpt_builds_latent_attention_and_its_cache():
    model = _gpt()
    for block in model.blocks:
        assert isinstance(block.attn, MultiHeadLatentAttention)
        assert block.attn.kv_rank == 12 and block.attn.d_rope == 4
    ids = torch.randint(0, 40, (2, 10), generator=torch.Generator().manual_seed(3))
    full = model(ids)
    cache = model.new_cache()
    assert all(isinstance(layer, LatentCache) for layer in cache.layers)
    steps = [model(ids[:, :6], cache=cache)] + [
        model(ids[:, t : t + 1], cache=cache) for t in range(6, 10)
    ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    assert cache.length == 10 and cache.layers[1].latent.shape == (2, 10, 12)


def test_gpt_config_round_trip_and_training_step():
    model = _gpt(d_rope=2)
    config = model.config()
    assert (config["attention"], config["kv_rank"], config["d_rope"]) == ("mla", 12, 2)
    again = GPT(**config).double()
    again.load_state_dict(model.state_dict())
    ids = torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(again.eval()(ids), model(ids))
    assert GPT(40, d_model=32, num_heads=4).config()["attention"] == "mha"
    model.train()
    loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"attention": "latent"}, "attention"),
        ({"kv_rank": None}, "kv_rank"),
        ({"pos": "learned"}, "pos"),
        ({"num_kv_heads": 2}, "num_kv_heads"),
        ({"window": 8}, "window"),
        ({"kv_rank": 0}, "kv_rank"),
    ],
)
def test_gpt_bad_latent_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        _gpt(**kwargs)


def test_gpt_latent_arguments_without_mla_and_attention_weights():
    with pytest.raises(ValueError, match="kv_rank"):
        GPT(40, d_model=32, num_heads=4, kv_rank=8)
    with pytest.raises(ValueError, match="return_attention"):
        _gpt()(torch.zeros(1, 3, dtype=torch.long), return_attention=True)


# ---- the decoding benchmark (python -m benchmarks.latent) --------------------------------


def test_the_decoding_benchmark_runs_and_counts_flops_exactly(tmp_path):
    # not a timing test: the script runs, both forms agree, and the FLOP counts are the
    # formulas' (for one new token after S cached positions)
    from benchmarks.latent import SHAPE, main

    result = main(["--quick", "--threads", "1", "--out", str(tmp_path / "b.json")])
    D, H, r = SHAPE["d_model"], SHAPE["num_heads"], SHAPE["kv_rank"]
    dn, dr, dv = SHAPE["d_nope"], SHAPE["d_rope"], SHAPE["d_v"]
    projections = 2 * D * H * (dn + dr) + 2 * D * (r + dr) + 2 * H * dv * D  # w_q, w_dkv, w_o
    for row in result["decode"]:
        S = row["S"] + 1  # the cached positions and the new one
        assert row["max_abs_difference"] < 1e-4
        naive = projections + 2 * S * r * H * (dn + dv) + 2 * S * H * (dn + dr + dv)
        absorbed = projections + 2 * H * dn * r + 2 * S * H * (2 * r + dr) + 2 * H * r * dv
        assert (row["naive_flops"], row["absorbed_flops"]) == (naive, absorbed)
        assert row["naive_ms"] > 0 and row["absorbed_ms"] > 0
    assert [row["T"] for row in result["prefill"]] == [16]
    assert (tmp_path / "b.json").exists()


def test_gpt_with_latent_attention_generates_the_same_tokens_with_and_without_cache():
    from attention_course import generate

    model = _gpt().float()
    prompt = torch.randint(0, 40, (2, 3), generator=torch.Generator().manual_seed(5))
    cached = generate(model, prompt, 8, temperature=0, use_cache=True)  # greedy
    recomputed = generate(model, prompt, 8, temperature=0, use_cache=False)
    assert torch.equal(cached, recomputed) and cached.shape == (2, 11)
