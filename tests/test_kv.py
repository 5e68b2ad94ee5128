"""Grouped keys and values and sliding windows (chapter 15) against PyTorch and brute force."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from attention_course import (
    GPT,
    CausalSelfAttention,
    causal_mask,
    generate,
    repeat_kv,
    sliding_window_mask,
)
from attention_course.kv import RollingAttentionCache
from attention_course.multihead import merge_heads, split_heads

B, T, D, H, V = 2, 9, 16, 4, 13


def test_repeat_kv_equals_repeat_interleave():
    x = torch.randn(2, 3, 5, 4)
    for n_rep in (1, 2, 4):
        assert_close(repeat_kv(x, n_rep), torch.repeat_interleave(x, n_rep, dim=1))
    out = repeat_kv(x, 2)
    for h in range(6):  # output head h is input head h // n_rep
        assert torch.equal(out[:, h], x[:, h // 2])
    with pytest.raises(ValueError, match="n_rep"):
        repeat_kv(x, 0)
    with pytest.raises(ValueError, match="x"):
        repeat_kv(torch.randn(3, 5, 4), 2)


CASES = [(1, 1, None), (6, 1, None), (6, 3, None), (6, 10, None), (3, 2, 7), (4, 5, 9), (1, 4, 6)]


@pytest.mark.parametrize("size,window,S", CASES)
def test_sliding_window_mask_against_brute_force(size, window, S):
    mask = sliding_window_mask(size, window, S=S)
    S = size if S is None else S
    expected = torch.zeros(size, S, dtype=torch.bool)
    for i in range(size):
        p = i + S - size  # query i is at position p
        for j in range(S):
            expected[i, j] = 0 <= p - j < window
    assert mask.dtype == torch.bool and torch.equal(mask, expected)
    if S == size:  # the last rows of the square mask
        assert torch.equal(sliding_window_mask(size, size + window), causal_mask(size))


def test_sliding_window_mask_rejects_bad_window():
    for window in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="window"):
            sliding_window_mask(5, window)


def _grouped(num_kv_heads, window=None):
    torch.manual_seed(0)
    attn = CausalSelfAttention(D, H, num_kv_heads=num_kv_heads, window=window).double()
    for p in attn.parameters():
        torch.nn.init.normal_(p, 0.0, 0.3)
    return attn


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_grouped_attention_equals_sdpa_enable_gqa_and_repeated_mha(num_kv_heads):
    attn = _grouped(num_kv_heads)
    Dh = D // H
    assert attn.w_k.weight.shape == (num_kv_heads * Dh, D) == attn.w_v.weight.shape
    assert attn.w_q.weight.shape == (D, D)
    x = torch.randn(B, T, D, dtype=torch.float64)
    out, weights = attn(x, need_weights=True)
    assert_close(attn(x), out)
    q = split_heads(attn.w_q(x), H)  # (B, H, T, Dh)
    k = split_heads(attn.w_k(x), num_kv_heads)  # (B, Hkv, T, Dh)
    v = split_heads(attn.w_v(x), num_kv_heads)
    # PyTorch's own grouped-query attention
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert_close(out, attn.w_o(merge_heads(ref)))
    # full multi-head attention on the repeated keys and values
    n_rep = H // num_kv_heads
    k_full = torch.repeat_interleave(k, n_rep, dim=1)
    v_full = torch.repeat_interleave(v, n_rep, dim=1)
    scores = q @ k_full.transpose(-2, -1) / Dh**0.5
    scores = scores.masked_fill(~causal_mask(T), float("-inf"))
    assert_close(weights, scores.softmax(-1))
    assert_close(out, attn.w_o(merge_heads(scores.softmax(-1) @ v_full)))


def test_one_kv_head_is_multi_query_attention():
    attn = _grouped(1)
    x = torch.randn(B, T, D, dtype=torch.float64)
    q = split_heads(attn.w_q(x), H)
    k = attn.w_k(x)[:, None]  # (B, 1, T, Dh): one key head shared by every query head
    v = attn.w_v(x)[:, None]
    ref = F.scaled_dot_product_attention(q, k.expand(-1, H, -1, -1), v.expand(-1, H, -1, -1),
                                         is_causal=True)  # fmt: skip
    assert_close(attn(x), attn.w_o(merge_heads(ref)))


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("window", [1, 3, 20])
def test_windowed_attention_equals_sdpa_with_band_mask(num_kv_heads, window):
    attn = _grouped(num_kv_heads, window)
    x = torch.randn(B, T, D, dtype=torch.float64)
    q = split_heads(attn.w_q(x), H)
    k = split_heads(attn.w_k(x), num_kv_heads)
    v = split_heads(attn.w_v(x), num_kv_heads)
    mask = causal_mask(T) & sliding_window_mask(T, window)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    out, weights = attn(x, need_weights=True)
    assert_close(out, attn.w_o(merge_heads(ref)))
    assert_close(attn(x), out)
    assert bool((weights[..., ~mask] == 0).all())


@pytest.mark.parametrize("num_kv_heads,window", [(2, None), (1, None), (2, 4), (1, 1), (4, 3)])
def test_cached_steps_equal_uncached_forward(num_kv_heads, window):
    torch.manual_seed(1)
    model = GPT(V, d_model=D, num_heads=H, num_layers=2, pos="none",
                num_kv_heads=num_kv_heads, window=window).double().eval()  # fmt: skip
    ids = torch.randint(0, V, (B, 15))
    full = model(ids)
    cache = model.new_cache()
    # a prompt longer than the window, then single tokens and a chunk of three
    chunks = [ids[:, :6], ids[:, 6:7], ids[:, 7:10], *ids[:, 10:].split(1, dim=1)]
    outs = [model(chunk, cache=cache) for chunk in chunks]
    assert_close(torch.cat(outs, dim=1), full)
    assert cache.length == 15


@pytest.mark.parametrize("num_kv_heads,window", [(2, None), (1, 5), (2, 3), (4, 6)])
def test_generate_with_cache_equals_without_past_the_wrap(num_kv_heads, window):
    torch.manual_seed(2)
    model = GPT(V, d_model=D, num_heads=H, num_layers=3, max_len=64,
                num_kv_heads=num_kv_heads, window=window)  # fmt: skip
    prompt = torch.randint(0, V, (B, 4))
    n = 24  # > 4 * window: the rolling buffer wraps several times
    cached = generate(model, prompt, n, temperature=0)
    uncached = generate(model, prompt, n, temperature=0, use_cache=False)
    assert torch.equal(cached, uncached)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(generate(model, prompt, n, generator=g1),
                       generate(model, prompt, n, use_cache=False, generator=g2))  # fmt: skip


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_cache_stores_only_the_kv_heads(num_kv_heads):
    model = GPT(V, d_model=D, num_heads=H, num_layers=2, num_kv_heads=num_kv_heads)
    cache = model.new_cache()
    model(torch.randint(0, V, (B, 10)), cache=cache)
    Dh = D // H
    for layer in cache.layers:
        assert layer.keys.shape == layer.values.shape == (B, num_kv_heads, 10, Dh)
        # the stored buffers (not only the views) have Hkv heads
        assert layer._keys.shape[1] == num_kv_heads


@pytest.mark.parametrize("num_kv_heads,window", [(2, 4), (1, 1), (4, 7)])
def test_rolling_cache_holds_at_most_window_positions(num_kv_heads, window):
    torch.manual_seed(4)
    model = GPT(V, d_model=D, num_heads=H, num_layers=2, pos="none",
                num_kv_heads=num_kv_heads, window=window).eval()  # fmt: skip
    ids = torch.randint(0, V, (B, 20))
    cache = model.new_cache()
    Dh = D // H
    expected_bytes = 2 * B * num_kv_heads * window * Dh * 4  # keys and values, float32
    with torch.no_grad():
        model(ids[:, :3], cache=cache)
        for t in range(3, 20):
            model(ids[:, t : t + 1], cache=cache)
            for layer in cache.layers:
                slot = layer
                assert isinstance(slot, RollingAttentionCache)
                assert slot.length == t + 1
                assert slot._keys.shape == slot._values.shape == (B, num_kv_heads, window, Dh)
                assert slot.nbytes == expected_bytes  # flat: it does not grow with t
                assert layer.keys.shape == (B, num_kv_heads, min(t + 1, window), Dh)
    # the stored keys are the projections of the last `window` positions, oldest first
    with torch.no_grad():
        x = model.blocks[0].norm1(model.tok_emb(ids))
        k = split_heads(model.blocks[0].attn.w_k(x), num_kv_heads)  # (B, Hkv, 20, Dh)
    assert_close(cache.layers[0].keys, k[:, :, 20 - window :])


def test_window_rejects_a_plain_cache_and_bad_arguments():
    from attention_course.kv_cache import AttentionCache

    attn = CausalSelfAttention(D, H, window=3)
    with pytest.raises(ValueError, match="cache"):
        attn(torch.randn(1, 2, D), cache=AttentionCache())
    with pytest.raises(ValueError, match="window"):
        CausalSelfAttention(D, H, window=0)
    with pytest.raises(ValueError, match="window"):
        GPT(V, d_model=D, num_heads=H, window=0)
    with pytest.raises(ValueError, match="window"):
        RollingAttentionCache(0)
    model = GPT(V, d_model=D, num_heads=H, num_kv_heads=2, window=5)
    again = GPT(**model.config())
    assert again.config() == model.config()
    assert again.blocks[0].attn.num_kv_heads == 2 and again.blocks[0].attn.window == 5


def test_cached_attention_weights_cover_the_visible_keys_only():
    torch.manual_seed(5)
    model = GPT(V, d_model=D, num_heads=H, num_layers=2, pos="none", num_kv_heads=2, window=3)
    model.eval()
    ids = torch.randint(0, V, (B, 8))
    full, full_weights = model(ids, return_attention=True)
    cache = model.new_cache()
    model(ids[:, :5], cache=cache)
    out, weights = model(ids[:, 5:], return_attention=True, cache=cache)
    assert_close(out, full[:, 5:])
    for w, wf in zip(weights, full_weights, strict=True):
        # queries 5..7 see the window - 1 = 2 cached positions 3, 4 and the new ones
        assert w.shape == (B, H, 3, 5)
        assert_close(w, wf[:, :, 5:, 3:])
        assert_close(wf[:, :, 5:, :3], torch.zeros(B, H, 3, 3))


def test_cache_nbytes_counts_the_allocated_buffers():
    """KVCache.nbytes: the growing cache's buffers double; the rolling one stays at window."""
    torch.manual_seed(0)
    full = GPT(11, d_model=16, num_heads=4, num_layers=2, pos="rope", num_kv_heads=2)
    rolling = GPT(11, d_model=16, num_heads=4, num_layers=2, pos="rope", num_kv_heads=2, window=8)
    ids = torch.randint(0, 11, (3, 100))
    per_position = 2 * 2 * 3 * 2 * 4 * 4  # layers * (k, v) * B * Hkv * Dh * 4 bytes
    # 60 tokens allocate 2 * 60 = 120 positions; the next 40 fit. The rolling one keeps 8.
    for model, positions in ((full, 120), (rolling, 8)):
        cache = model.new_cache()
        assert cache.nbytes == 0
        with torch.no_grad():
            model(ids[:, :60], cache=cache)
            model(ids[:, 60:], cache=cache)
        assert cache.nbytes == per_position * positions
