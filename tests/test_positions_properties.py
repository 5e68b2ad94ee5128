"""Properties chapter 14 states that tests/test_positions.py does not pin down: relative
positions run past max_len, ALiBi's bias is a function of the offset (and gives the same
softmax as BLOOM's form), and swapping the RoPE layout inside a model is undone exactly by
permuting the rows of w_q and w_k."""

from __future__ import annotations

import pytest
import torch

from attention_course import GPT, alibi_bias, alibi_slopes


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "alibi", "none"])
def test_only_absolute_positions_stop_at_max_len(pos):
    model = GPT(20, d_model=16, num_heads=2, num_layers=1, max_len=8, pos=pos)
    ids = torch.zeros(1, 12, dtype=torch.long)
    if pos in ("learned", "sinusoidal"):
        with pytest.raises(ValueError, match="max_len"):
            model(ids)
    else:
        assert model(ids).shape == (1, 12, 20)


def test_alibi_bias_depends_only_on_the_offset():
    full = alibi_bias(4, 20)  # (H, 20, 20)
    for shift in (1, 5, 11):
        moved = full[:, shift:, shift:]  # the same queries and keys, both shifted
        assert torch.equal(moved, alibi_bias(4, 20 - shift))


def test_alibi_softmax_equals_the_bloom_form():
    """BLOOM adds +slope * j instead of -slope * (i - j): per row they differ by a
    constant, so the softmax over the visible keys is the same."""
    H, T = 4, 9
    scores = torch.randn(H, T, T, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    hidden = ~torch.ones(T, T, dtype=torch.bool).tril()
    slopes = alibi_slopes(H).double()
    ours = (scores + alibi_bias(H, T, dtype=torch.float64)).masked_fill(hidden, float("-inf"))
    bloom = scores + slopes[:, None, None] * torch.arange(T, dtype=torch.float64)
    bloom = bloom.masked_fill(hidden, float("-inf"))
    assert torch.allclose(ours.softmax(-1), bloom.softmax(-1), atol=1e-12)


def _interleaved(x, positions=None, base=10000.0):
    T, Dh = x.shape[-2], x.shape[-1]
    positions = torch.arange(T) if positions is None else positions
    i = torch.arange(Dh // 2, dtype=torch.float64)
    angles = positions.double()[:, None] * base ** (-2 * i / Dh)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


def test_swapping_the_rope_layout_is_undone_by_permuting_w_q_and_w_k():
    torch.manual_seed(0)
    model = GPT(30, d_model=32, num_heads=4, num_layers=2, pos="rope").double().eval()
    ids = torch.randint(0, 30, (2, 11))
    for block in model.blocks:  # sharper attention than at initialisation, as after training
        block.attn.w_q.weight.data *= 30
        block.attn.w_k.weight.data *= 30
    with torch.no_grad():
        right = model(ids)
    # the other layout is a piece the model is given (rope_fn), with the same weights
    swapped_model = GPT(30, d_model=32, num_heads=4, num_layers=2, pos="rope", rope_fn=_interleaved)
    swapped_model = swapped_model.double().eval()
    swapped_model.load_state_dict(model.state_dict())
    model = swapped_model
    with torch.no_grad():
        swapped = model(ids)
    assert not torch.allclose(right, swapped, atol=1e-2)  # the wrong layout changes the model
    Dh = 32 // 4
    half = torch.arange(Dh // 2)
    order = torch.stack([half, half + Dh // 2], dim=1).flatten()  # (0, Dh/2, 1, Dh/2 + 1, ..)
    for block in model.blocks:
        for proj in (block.attn.w_q, block.attn.w_k):
            w = proj.weight.data
            proj.weight.data = w.view(4, Dh, -1)[:, order].reshape(32, -1)
    with torch.no_grad():
        permuted = model(ids)
    assert torch.allclose(right, permuted, atol=1e-10)


@pytest.mark.parametrize("d_model", [16, 64, 128])
def test_sinusoidal_token_and_position_parts_have_comparable_scale_at_init(d_model):
    """Vaswani et al. (2017, §3.4): embeddings ~ N(0, d^-1/2) times sqrt(d), next to a table
    of rms ~0.71. With GPT-2's unscaled N(0, 0.02) the positions were ~36x the tokens."""
    torch.manual_seed(0)
    model = GPT(50, d_model=d_model, num_heads=2, num_layers=1, max_len=64, pos="sinusoidal")
    ids = torch.randint(0, 50, (4, 64))
    token_part = model.tok_emb(ids) * d_model**0.5  # what forward adds the table to
    position_part = model.pos_table[:64]
    ratio = token_part.pow(2).mean().sqrt() / position_part.pow(2).mean().sqrt()
    assert 0.5 < ratio < 2
    # the input forward builds is exactly token part + position part
    seen = {}
    model.drop.register_forward_hook(lambda m, inp, out: seen.setdefault("x", inp[0]))
    model(ids)
    assert torch.allclose(seen["x"], token_part + position_part)


def test_sinusoidal_scaling_leaves_the_other_settings_draws_unchanged():
    """Only the sinusoidal token embedding is rescaled: the same seed gives every other
    weight the same values as GPT-2's convention (here: as pos="none")."""
    torch.manual_seed(0)
    sin = GPT(50, d_model=32, num_heads=2, num_layers=2, max_len=16, pos="sinusoidal")
    torch.manual_seed(0)
    plain = GPT(50, d_model=32, num_heads=2, num_layers=2, max_len=16, pos="none")
    assert list(sin.state_dict()) == list(plain.state_dict())
    for (name, a), (_, b) in zip(sin.state_dict().items(), plain.state_dict().items()):
        if name == "tok_emb.weight" or name == "head.weight":
            assert torch.allclose(a, b * 32**-0.5 / 0.02)
        else:
            assert torch.equal(a, b), name
    assert abs(plain.tok_emb.weight.std().item() - 0.02) < 0.002


@pytest.mark.parametrize("pos", ["learned", "sinusoidal"])
def test_cached_generation_equals_the_full_pass_for_absolute_positions(pos):
    torch.manual_seed(0)
    model = GPT(30, d_model=32, num_heads=4, num_layers=2, max_len=16, pos=pos).double().eval()
    ids = torch.randint(0, 30, (2, 12))
    cache = model.new_cache()
    parts = [model(ids[:, :5], cache=cache)]
    parts += [model(ids[:, t : t + 1], cache=cache) for t in range(5, 12)]
    assert torch.allclose(torch.cat(parts, dim=1), model(ids), atol=1e-10)
