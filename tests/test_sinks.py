"""Attention sinks (chapter 19): streaming_mask, sink_attention, the streaming cache, and
the GPT's learned sinks, against their definitions and Hugging Face's gpt-oss."""

from __future__ import annotations

import types

import pytest
import torch

from attention_course import GPT, CausalSelfAttention, repeat_kv, sliding_window_mask
from attention_course.attention import scaled_dot_product_attention
from attention_course.kv import KVLayout, RollingAttentionCache
from attention_course.kv_cache import DecoderCache
from attention_course.sinks import (
    StreamingAttentionCache,
    sink_attention,
    streaming_mask,
)


# ---------------------------------------------------------------- streaming_mask
@pytest.mark.parametrize("size,window,num_sink", [(1, 1, 0), (7, 3, 2), (9, 4, 1), (6, 10, 3)])
def test_streaming_mask_definition(size, window, num_sink):
    mask = streaming_mask(size, window, num_sink)
    assert mask.shape == (size, size) and mask.dtype == torch.bool
    for i in range(size):
        for j in range(size):
            expected = j <= i and (j < num_sink or i - j < window)
            assert bool(mask[i, j]) == expected, (i, j)


@pytest.mark.parametrize("size,window", [(5, 1), (8, 3), (6, 6), (4, 9)])
def test_streaming_mask_without_sinks_is_the_sliding_window(size, window):
    assert torch.equal(streaming_mask(size, window, 0), sliding_window_mask(size, window))


def test_streaming_mask_keeps_the_first_columns():
    mask = streaming_mask(10, 3, 2)
    assert bool(mask[:, :2].tril().equal(torch.ones(10, 2, dtype=torch.bool).tril()))
    assert not bool(mask[9, 2:7].any())  # the evicted middle
    assert bool(mask[9, 7:].all())  # the window


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"size": 0, "window": 2, "num_sink": 1}, "size"),
        ({"size": 4, "window": 0, "num_sink": 1}, "window"),
        ({"size": 4, "window": 2, "num_sink": -1}, "num_sink"),
        ({"size": 4, "window": 2, "num_sink": 1.0}, "num_sink"),
        ({"size": 4, "window": 2, "num_sink": True}, "num_sink"),
    ],
)
def test_streaming_mask_messages(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}: got"):
        streaming_mask(**kwargs)


# ---------------------------------------------------------------- sink_attention
def _qkv(B=2, H=3, T=5, S=5, Dk=4, Dv=6, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, Dk, generator=g, dtype=dtype)
    k = torch.randn(B, H, S, Dk, generator=g, dtype=dtype)
    v = torch.randn(B, H, S, Dv, generator=g, dtype=dtype)
    sinks = torch.randn(H, generator=g, dtype=dtype)
    return q, k, v, sinks


def test_sink_attention_formula():
    q, k, v, sinks = _qkv(T=4, S=7)
    out, w = sink_attention(q, k, v, sinks)
    scores = q @ k.transpose(-2, -1) / 2.0  # Dk = 4
    e = scores.exp()
    expected = e / (e.sum(-1, keepdim=True) + sinks.exp()[None, :, None, None])
    torch.testing.assert_close(w, expected)
    torch.testing.assert_close(out, expected @ v)
    assert bool((w.sum(-1) < 1).all())  # the sink's share is dropped


def test_sink_attention_minus_inf_sinks_is_softmax_attention():
    q, k, v, _ = _qkv(T=5, S=5)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    sinks = torch.full((3,), float("-inf"), dtype=torch.float64)
    out, w = sink_attention(q, k, v, sinks, mask=mask)
    ref_out, ref_w = scaled_dot_product_attention(q, k, v, mask=mask)
    torch.testing.assert_close(w, ref_w)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5, dtype=torch.float64))


def test_sink_attention_masked_keys_and_empty_rows():
    q, k, v, sinks = _qkv(T=3, S=4)
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 1]], dtype=torch.bool)
    out, w = sink_attention(q, k, v, sinks, mask=mask)
    assert bool((w[..., ~mask] == 0).all())  # masked keys: exactly 0
    assert bool((out[:, :, 1] == 0).all())  # a row with no key: all on the sink, zero output
    additive = torch.zeros(3, 4, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    out2, w2 = sink_attention(q, k, v, sinks, mask=additive)
    torch.testing.assert_close(w2, w)
    torch.testing.assert_close(out2, out)
    assert not bool(torch.isnan(out2).any())


def test_sink_attention_half_precision_and_grads():
    q, k, v, sinks = _qkv(dtype=torch.float32)
    out16, w16 = sink_attention(q.half(), k.half(), v.half(), sinks.half())
    assert out16.dtype == torch.float16 and w16.dtype == torch.float16
    out, _ = sink_attention(q, k, v, sinks)
    torch.testing.assert_close(out16.float(), out, atol=5e-3, rtol=5e-3)
    sinks = sinks.clone().requires_grad_()
    sink_attention(q, k, v, sinks)[0].sum().backward()
    assert sinks.grad is not None and bool((sinks.grad != 0).all())


@pytest.mark.parametrize("groups", [1, 2])
def test_sink_attention_equals_hf_gpt_oss_eager(groups):
    pytest.importorskip("transformers")
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    q, k, v, sinks = _qkv(B=2, H=4, T=5, S=5, Dk=8, Dv=8)
    k, v = k[:, : 4 // groups], v[:, : 4 // groups]  # Hkv = H / groups key/value heads
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    additive = torch.zeros(5, 5, dtype=torch.float64).masked_fill(~causal, float("-inf"))
    # the attributes eager_attention_forward reads from its module
    module = types.SimpleNamespace(sinks=sinks, num_key_value_groups=groups, training=False)
    scale = 8**-0.5
    hf_out, hf_w = eager_attention_forward(module, q, k, v, additive[None, None], scale)
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)  # ours takes H heads
    out, w = sink_attention(q, k, v, sinks, mask=causal)
    torch.testing.assert_close(w, hf_w)
    torch.testing.assert_close(out.transpose(1, 2), hf_out)  # HF returns (B, T, H, Dv)


@pytest.mark.parametrize(
    "change,name",
    [
        (lambda q, k, v, s: (q[0], k[0], v[0], s), "query"),
        (lambda q, k, v, s: (q, k[:, :2], v[:, :2], s), "key, value"),
        (lambda q, k, v, s: (q, k, v, s[:2]), "sinks"),
        (lambda q, k, v, s: (q, k, v, s.long()), "sinks"),
        (lambda q, k, v, s: (q, k[..., :3], v, s), "key"),
    ],
)
def test_sink_attention_messages(change, name):
    q, k, v, sinks = change(*_qkv())
    with pytest.raises(ValueError, match=f"^{name}: got"):
        sink_attention(q, k, v, sinks)


def test_sink_attention_mask_message():
    q, k, v, sinks = _qkv(T=5, S=5)
    with pytest.raises(ValueError, match="^mask: got"):
        sink_attention(q, k, v, sinks, mask=torch.ones(4, 5, dtype=torch.bool))


# ---------------------------------------------------------------- the streaming cache
def _step_by_step(model, ids, cache, chunks=None):
    """Logits of a decode through ``cache``, ``chunks`` tokens at a time (default 1)."""
    chunks = chunks or [1] * ids.shape[1]
    out, at = [], 0
    for n in chunks:
        out.append(model(ids[:, at : at + n], cache=cache))
        at += n
    return torch.cat(out, dim=1)


def _streaming_model(pos, window=4, num_sink=2, seed=0, num_layers=2):
    torch.manual_seed(seed)
    model = GPT(13, d_model=16, num_heads=2, num_layers=num_layers, max_len=64, pos=pos)
    full = GPT(**{**model.config(), "window": window, "num_sink": num_sink})
    full.load_state_dict(model.state_dict())
    return full.double().eval()


@pytest.mark.parametrize("pos", ["learned", "none", "rope"])
@pytest.mark.parametrize("chunks", [None, [3, 1, 5, 2, 1, 4, 1, 3]])
def test_streaming_cache_absolute_positions_equals_the_full_pass(pos, chunks):
    """Keys kept at their absolute positions: any decode (one token or several per step)
    equals one full pass with streaming_mask. For RoPE this is the absolute variant
    (``positions=None``)."""
    model = _streaming_model(pos)
    ids = torch.randint(0, 13, (2, 20), generator=torch.Generator().manual_seed(1))
    full = model(ids)
    cache = DecoderCache([StreamingAttentionCache(4, 2) for _ in range(2)])
    torch.testing.assert_close(_step_by_step(model, ids, cache, chunks), full)
    assert cache.length == 20
    assert cache.layers[0].keys.shape[2] == 2 + 4  # the sinks and the window, no more


def test_full_pass_uses_streaming_mask():
    model = _streaming_model("rope", window=3, num_sink=1)
    ids = torch.randint(0, 13, (1, 9), generator=torch.Generator().manual_seed(2))
    _, weights = model(ids, return_attention=True)
    visible = streaming_mask(9, 3, 1)
    for w in weights:
        assert bool((w[..., ~visible] == 0).all())
        assert bool((w[..., visible] > 0).all())


def test_streaming_cache_within_cache_positions_for_rope():
    """GPT.new_cache with RoPE numbers positions within the cache (StreamingLLM): equal to
    the full pass until the window first slides past a non-sink position, different after
    (each query would need its own shift of the sinks); equal to a full pass over just the
    kept tokens renumbered 0, 1, .. (what StreamingLLM computes), step by step."""
    W, ns, n = 4, 2, 14
    model = _streaming_model("rope", window=W, num_sink=ns)
    ids = torch.randint(0, 13, (2, n), generator=torch.Generator().manual_seed(3))
    cache = model.new_cache()
    assert isinstance(cache.layers[0], StreamingAttentionCache)
    assert cache.layers[0].positions is model.attention_positions
    stepped = _step_by_step(model, ids, cache)
    full = model(ids)
    first = ns + W  # position ns + W is the first query that no longer sees position ns
    torch.testing.assert_close(stepped[:, :first], full[:, :first])
    assert not torch.allclose(stepped[:, first:], full[:, first:])
    # The reference: token t's logits from a fresh pass over its kept tokens only (its
    # sinks, then its window), at positions 0, 1, ..: a full causal pass of a model
    # without a window (the kept tokens all see each other) gives the last token's logits
    # only if deeper layers saw the same keys, so compare layer-1 models.
    one = _streaming_model("rope", window=W, num_sink=ns, num_layers=1)
    plain = GPT(**{**one.config(), "window": None, "num_sink": 0}).double().eval()
    plain.load_state_dict(one.state_dict())
    stepped1 = _step_by_step(one, ids, one.new_cache())
    for t in range(n):
        kept = list(range(min(ns, t + 1))) + list(range(max(ns, t - W + 1), t + 1))
        ref = plain(ids[:, kept])[:, -1]
        torch.testing.assert_close(stepped1[:, t], ref)


def test_streaming_cache_within_cache_positions_one_token_per_step():
    model = _streaming_model("rope", window=3, num_sink=1)
    cache = model.new_cache()
    ids = torch.randint(0, 13, (1, 8), generator=torch.Generator().manual_seed(4))
    model(ids[:, :4], cache=cache)  # nothing evicted yet: a prefill is fine
    with pytest.raises(ValueError, match="^keys: got 2 new positions"):
        model(ids[:, 4:6], cache=cache)


def test_streaming_cache_memory_stops_growing():
    cache = StreamingAttentionCache(window=5, num_sink=3)
    k = torch.randn(1, 2, 1, 4)
    for _ in range(40):
        keys, _ = cache.update(k, k)
    assert keys.shape[2] == 3 + 4 + 1  # sinks, window - 1 cached, the new one
    assert cache.keys.shape == (1, 2, 3 + 5, 4)
    assert cache.nbytes == (3 + 5) * 2 * 4 * 4 * 2  # keys and values, float32


def test_streaming_layout_messages_and_cache_check():
    with pytest.raises(ValueError, match="^num_sink: got 2 without a window"):
        KVLayout(4, window=None, num_sink=2)
    with pytest.raises(ValueError, match="^num_sink: got -1"):
        KVLayout(4, window=3, num_sink=-1)
    with pytest.raises(ValueError, match="^num_sink: given with pos='alibi'"):
        GPT(11, d_model=8, num_heads=2, num_layers=1, pos="alibi", window=3, num_sink=1)
    model = GPT(11, d_model=8, num_heads=2, num_layers=1, pos="rope", window=3, num_sink=1)
    wrong = DecoderCache([RollingAttentionCache(3)])
    with pytest.raises(ValueError, match="^cache: got RollingAttentionCache"):
        model(torch.zeros(1, 2, dtype=torch.long), cache=wrong)
    with pytest.raises(ValueError, match="^positions: got"):
        StreamingAttentionCache(3, 1, positions="rope")


# ---------------------------------------------------------------- learned sinks in the GPT
def test_gpt_learned_sinks_shapes_grads_and_config():
    torch.manual_seed(0)
    model = GPT(17, d_model=16, num_heads=4, num_layers=2, max_len=32, pos="rope", sinks=True)
    for block in model.blocks:
        assert block.attn.sinks.shape == (4,)
        assert bool((block.attn.sinks == 0).all())
    assert "blocks.0.attn.sinks" in model.state_dict()
    ids = torch.randint(0, 17, (3, 10))
    logits, weights = model(ids, return_attention=True)
    assert logits.shape == (3, 10, 17) and weights[0].shape == (3, 4, 10, 10)
    assert bool((weights[0].sum(-1) < 1).all())  # the sink took its share
    logits.logsumexp(-1).mean().backward()
    assert all(bool((b.attn.sinks.grad != 0).any()) for b in model.blocks)
    config = model.config()
    assert config["sinks"] is True and config["num_sink"] == 0
    again = GPT(**config)
    again.load_state_dict(model.state_dict())
    torch.testing.assert_close(again(ids), model(ids))
    assert GPT(**{**config, "sinks": False}).blocks[0].attn.sinks is None


def test_gpt_learned_sinks_fast_path_and_cache_agree():
    torch.manual_seed(1)
    model = GPT(17, d_model=16, num_heads=4, num_layers=2, pos="rope", sinks=True).double()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.sinks.normal_()
    model.eval()
    ids = torch.randint(0, 17, (2, 9))
    full = model(ids)
    with_weights, _ = model(ids, return_attention=True)
    torch.testing.assert_close(full, with_weights)
    torch.testing.assert_close(_step_by_step(model, ids, model.new_cache()), full)


def test_gpt_learned_sinks_minus_inf_is_the_plain_model():
    torch.manual_seed(2)
    plain = GPT(17, d_model=16, num_heads=4, num_layers=2, num_kv_heads=2, pos="rope").double()
    sunk = GPT(**{**plain.config(), "sinks": True}).double()
    state = plain.state_dict()
    for i in range(2):
        state[f"blocks.{i}.attn.sinks"] = torch.full((4,), float("-inf"), dtype=torch.float64)
    sunk.load_state_dict(state)
    ids = torch.randint(0, 17, (2, 8))
    torch.testing.assert_close(sunk(ids), plain(ids))


def test_causal_self_attention_sinks_message():
    with pytest.raises(ValueError, match="^sinks: got 1"):
        CausalSelfAttention(16, 4, sinks=1)
    with pytest.raises(ValueError, match="^sinks: got 'yes'"):
        GPT(11, d_model=8, num_heads=2, num_layers=1, sinks="yes")


def test_streaming_cache_keeps_the_sinks_then_the_window_in_order():
    cache = StreamingAttentionCache(window=3, num_sink=2)
    returned = []
    for n in (1, 4, 1, 2, 1):  # steps of several tokens and of one
        start = cache.length
        pos = torch.arange(start, start + n, dtype=torch.float32).view(1, 1, n, 1)
        keys, values = cache.update(pos, -pos)
        returned.append(keys.flatten().tolist())
        torch.testing.assert_close(values, -keys)
    # what each step returns: the sinks, the window the oldest new query sees, the new ones
    assert returned == [[0], [0, 1, 2, 3, 4], [0, 1, 3, 4, 5], [0, 1, 4, 5, 6, 7], [0, 1, 6, 7, 8]]
    assert cache.keys.flatten().tolist() == [0, 1, 6, 7, 8]  # kept: sinks, then the window


def test_streaming_cache_with_grouped_heads_equals_the_full_pass():
    torch.manual_seed(5)
    base = GPT(13, d_model=16, num_heads=4, num_kv_heads=1, num_layers=2, pos="rope")
    model = GPT(**{**base.config(), "window": 3, "num_sink": 1}).double().eval()
    model.load_state_dict(base.double().state_dict())
    ids = torch.randint(0, 13, (2, 12), generator=torch.Generator().manual_seed(6))
    cache = DecoderCache([StreamingAttentionCache(3, 1) for _ in range(2)])
    torch.testing.assert_close(_step_by_step(model, ids, cache, [5, 1, 4, 2]), model(ids))
    assert cache.layers[0].keys.shape == (2, 1, 1 + 3, 4)  # the one key/value head only
