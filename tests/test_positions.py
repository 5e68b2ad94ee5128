"""apply_rope, alibi_slopes, alibi_bias and GPT(pos="rope" | "alibi") (chapter 14)."""

from __future__ import annotations

import math

import pytest
import torch

from attention_course import (
    GPT,
    CausalSelfAttention,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    generate,
)

V = 13


def rope_complex(x, positions, base=10000.0):
    """From scratch: the half-split pair (x_i, x_{i+Dh/2}) is the complex number
    x_i + i x_{i+Dh/2}, multiplied by e^{i p theta_i}, theta_i = base^(-2i/Dh)."""
    half = x.shape[-1] // 2
    theta = base ** (-2 * torch.arange(half, dtype=torch.float64) / x.shape[-1])
    z = torch.complex(x[..., :half], x[..., half:])
    z = z * torch.polar(torch.ones_like(theta), positions.double()[..., None] * theta)
    return torch.cat([z.real, z.imag], dim=-1)


def rope_interleaved(x, positions, base=10000.0):
    """The GPT-J / RoFormer layout: adjacent features (2i, 2i + 1) form a pair."""
    Dh = x.shape[-1]
    theta = base ** (-2 * torch.arange(Dh // 2, dtype=torch.float64) / Dh)
    angles = positions.double()[..., None] * theta  # (T, Dh/2)
    cos, sin = angles.cos(), angles.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = odd * cos + even * sin
    return out


def rotate_half(x):
    """Hugging Face LLaMA's rotate_half (transformers.models.llama.modeling_llama)."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope_hf(x, positions, base=10000.0):
    """Hugging Face's formulation: inv_freq, emb = cat(freqs, freqs), x cos + rotate_half(x) sin."""
    Dh = x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, Dh, 2, dtype=torch.float64) / Dh))
    freqs = positions.double()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return x * emb.cos() + rotate_half(x) * emb.sin()


def test_apply_rope_matches_the_complex_number_formula():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    positions = torch.tensor([0, 1, 2, 5, 9, 100, 4000])
    assert torch.allclose(apply_rope(x, positions), rope_complex(x, positions), atol=1e-10)
    assert torch.allclose(apply_rope(x), rope_complex(x, torch.arange(7)), atol=1e-10)
    out = apply_rope(x, positions, base=500.0)
    assert torch.allclose(out, rope_complex(x, positions, base=500.0), atol=1e-10)
    # float32: same up to rounding; position 0 is the identity
    x32 = x.float()
    assert torch.allclose(apply_rope(x32, positions), rope_complex(x, positions).float(), atol=1e-4)
    assert torch.equal(apply_rope(x32)[..., 0, :], x32[..., 0, :])


def test_half_split_equals_interleaved_after_the_fixed_permutation():
    torch.manual_seed(1)
    Dh = 10
    x = torch.randn(3, 6, Dh, dtype=torch.float64)
    positions = torch.arange(6) * 3
    # interleaved feature 2i is half-split feature i; 2i + 1 is i + Dh/2
    perm = torch.stack([torch.arange(Dh // 2), torch.arange(Dh // 2) + Dh // 2], -1).flatten()
    out = apply_rope(x, positions)
    assert torch.allclose(out[..., perm], rope_interleaved(x[..., perm], positions), atol=1e-10)
    # ...and the two layouts differ on the same features: mixing them is a bug
    assert not torch.allclose(out, rope_interleaved(x, positions), atol=1e-3)


def test_rope_score_depends_only_on_the_offset():
    torch.manual_seed(2)
    q, k = torch.randn(2, 1, 16, dtype=torch.float64)

    def score(m, n):
        qm = apply_rope(q, torch.tensor([m]))
        kn = apply_rope(k, torch.tensor([n]))
        return float((qm * kn).sum())

    for m, n in [(0, 0), (5, 2), (2, 5), (37, 30)]:
        for shift in (1, 13, 1000):
            assert score(m, n) == pytest.approx(score(m + shift, n + shift), abs=1e-9)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)
    # the rotation keeps lengths
    assert torch.allclose(apply_rope(q, torch.tensor([77])).norm(), q.norm())


def test_rope_batched_positions():
    torch.manual_seed(3)
    x = torch.randn(3, 2, 5, 8, dtype=torch.float64)  # (B, H, T, Dh)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11], [4, 4, 9, 0, 2]])  # (B, T)
    out = apply_rope(x, positions)
    for b in range(3):
        assert torch.allclose(out[b], apply_rope(x[b], positions[b]), atol=1e-12)
    x3 = x[:, 0]  # (B, T, Dh)
    assert torch.allclose(apply_rope(x3, positions), out[:, 0], atol=1e-12)


def test_apply_rope_bad_arguments():
    with pytest.raises(ValueError, match="x"):
        apply_rope(torch.randn(2, 5, 7))  # Dh odd
    with pytest.raises(ValueError, match="positions"):
        apply_rope(torch.randn(2, 5, 8), torch.arange(4))
    with pytest.raises(ValueError, match="positions"):
        apply_rope(torch.randn(2, 5, 8), torch.arange(5.0))
    with pytest.raises(ValueError, match="positions"):
        apply_rope(torch.randn(2, 5, 8), torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="base"):
        apply_rope(torch.randn(2, 5, 8), base=0)


def test_alibi_slopes_powers_of_two_and_the_papers_rule():
    assert torch.equal(alibi_slopes(8), torch.tensor([2.0**-k for k in range(1, 9)]))
    assert torch.equal(alibi_slopes(1), torch.tensor([2.0**-8]))
    assert torch.allclose(alibi_slopes(4), torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]))
    # 6 heads: the 4 slopes for 4 heads, then slopes 0 and 2 of the 8-head sequence
    expected = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    assert torch.allclose(alibi_slopes(6), torch.tensor(expected))

    def paper(n):  # the authors' get_slopes (ofirpress/attention_with_linear_biases)
        def power_of_2(n):
            start = 2 ** (-(2 ** -(math.log2(n) - 3)))
            return [start * start**i for i in range(n)]

        if math.log2(n).is_integer():
            return power_of_2(n)
        closest = 2 ** math.floor(math.log2(n))
        return power_of_2(closest) + paper(2 * closest)[0::2][: n - closest]

    for H in (1, 2, 3, 5, 6, 7, 8, 12, 16, 20, 48):
        assert torch.allclose(alibi_slopes(H), torch.tensor(paper(H), dtype=torch.float32))
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(0)


@pytest.mark.parametrize("H, T, S", [(4, 5, None), (6, 3, 7), (3, 1, 9), (8, 4, 4)])
def test_alibi_bias_against_a_loop(H, T, S):
    bias = alibi_bias(H, T, S)
    S = T if S is None else S
    assert bias.shape == (H, T, S)
    slopes = alibi_slopes(H)
    for h in range(H):
        for i in range(T):
            for j in range(S):
                if j <= i + S - T:
                    expected = -float(slopes[h]) * ((i + S - T) - j)
                    assert float(bias[h, i, j]) == pytest.approx(expected)


def test_alibi_bias_bad_arguments():
    with pytest.raises(ValueError, match="S"):
        alibi_bias(4, 5, 3)
    with pytest.raises(ValueError, match="T"):
        alibi_bias(4, 0)


def _reference_attention(attn, x, pos):
    """CausalSelfAttention written out: Hugging Face's rotate_half RoPE, or ALiBi's bias."""
    B, T, D = x.shape
    H, Dh = attn.num_heads, D // attn.num_heads
    q, k, v = (w(x).view(B, T, H, Dh).transpose(1, 2) for w in (attn.w_q, attn.w_k, attn.w_v))
    positions = torch.arange(T)
    scores_bias = torch.zeros(H, T, T, dtype=x.dtype)
    if pos == "rope":
        q, k = rope_hf(q, positions), rope_hf(k, positions)
    else:
        slopes = alibi_slopes(H).double()
        for i in range(T):
            for j in range(i + 1):
                scores_bias[:, i, j] = -slopes * (i - j)
    scores = q @ k.transpose(-2, -1) / math.sqrt(Dh) + scores_bias
    scores = scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
    out = scores.softmax(-1) @ v
    return attn.w_o(out.transpose(1, 2).reshape(B, T, D))


@pytest.mark.parametrize("pos", ["rope", "alibi"])
def test_causal_self_attention_matches_the_written_out_reference(pos):
    torch.manual_seed(4)
    attn = CausalSelfAttention(24, 3, pos=pos).double()
    x = torch.randn(2, 9, 24, dtype=torch.float64)
    expected = _reference_attention(attn, x, pos)
    out_w, weights = attn(x, need_weights=True)
    assert torch.allclose(attn(x), expected, atol=1e-10)
    assert torch.allclose(out_w, expected, atol=1e-10)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 3, 9, dtype=torch.float64))
    assert bool((weights.triu(1) == 0).all())


@pytest.fixture(params=["rope", "alibi"])
def model(request):
    torch.manual_seed(5)
    return GPT(V, d_model=16, num_heads=2, num_layers=2, max_len=8, pos=request.param).double()


def test_cached_logits_equal_the_full_pass(model):
    ids = torch.randint(0, V, (3, 12))  # longer than max_len: relative positions have no limit
    full = model(ids)
    cache = model.new_cache()
    parts = [model(ids[:, :5], cache=cache)]
    parts += [model(ids[:, t : t + 1], cache=cache) for t in range(5, 9)]
    parts.append(model(ids[:, 9:], cache=cache))
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-10)


@pytest.mark.parametrize(
    "settings", [{"temperature": 0}, {"temperature": 1.0}, {"temperature": 0.8, "top_k": 5}]
)
def test_generation_same_with_and_without_the_cache(model, settings):
    prompt = torch.randint(0, V, (4, 3))
    runs = []
    for use_cache in (True, False):
        gen = torch.Generator().manual_seed(123)
        runs.append(generate(model, prompt, 15, use_cache=use_cache, generator=gen, **settings))
    assert torch.equal(runs[0], runs[1])


def test_prefix_outputs_do_not_see_later_tokens(model):
    ids = torch.randint(0, V, (2, 10))
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % V
    a, b = model(ids), model(changed)
    assert torch.allclose(a[:, :6], b[:, :6], atol=1e-12)
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_gpt_rope_equals_hugging_face_rotate_half():
    torch.manual_seed(6)
    model = GPT(V, d_model=16, num_heads=2, num_layers=2, pos="rope").double().eval()
    ids = torch.randint(0, V, (2, 7))
    x = model.tok_emb(ids)  # no absolute positions are added
    for block in model.blocks:
        x = x + _reference_attention(block.attn, block.norm1(x), "rope")
        x = x + block.ffn(block.norm2(x))
    assert torch.allclose(model(ids), model.head(model.norm(x)), atol=1e-10)
    assert not hasattr(model, "pos_emb")


def test_attention_weights_path_with_the_cache_uses_absolute_positions(model):
    ids = torch.randint(0, V, (2, 6))
    _, full = model(ids, return_attention=True)
    cache = model.new_cache()
    model(ids[:, :4], cache=cache)
    _, last = model(ids[:, 4:], return_attention=True, cache=cache)
    for f, w in zip(full, last):
        assert torch.allclose(w, f[:, :, 4:], atol=1e-10)
