"""`GPT(ffn="none")`: the attention-only model of chapter 17 (no FFN in any block)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from attention_course import GPT


@pytest.mark.parametrize("pos", ["learned", "rope", "alibi"])
def test_cached_steps_equal_the_full_pass(pos):
    torch.manual_seed(0)
    model = GPT(20, d_model=32, num_heads=4, num_layers=2, max_len=64, pos=pos, ffn="none")
    model = model.double().eval()
    ids = torch.randint(0, 20, (2, 12))
    full = model(ids)  # (B, T, V)
    cache = model.new_cache()
    steps = [model(ids[:, :5], cache=cache)]
    steps += [model(ids[:, t : t + 1], cache=cache) for t in range(5, 12)]
    assert_close(torch.cat(steps, dim=1), full)


def test_blocks_are_attention_plus_residual_only():
    torch.manual_seed(0)
    model = GPT(20, d_model=32, num_heads=4, num_layers=2, ffn="none", tie_weights=False).eval()
    assert all(block.ffn is None for block in model.blocks)
    ids = torch.randint(0, 20, (2, 7))
    x = model.tok_emb(ids) + model.pos_emb(torch.arange(7))
    for block in model.blocks:
        x = x + block.attn(block.norm1(x))
    assert_close(model(ids), model.head(model.norm(x)))
    n_ffn = sum(p.numel() for p in GPT(20, d_model=32, num_layers=2).parameters())
    assert sum(p.numel() for p in model.parameters()) < n_ffn
    assert GPT(**model.config()).config() == model.config()


def test_return_attention_gives_one_causal_distribution_per_layer():
    torch.manual_seed(0)
    model = GPT(20, d_model=32, num_heads=4, num_layers=3, ffn="none").eval()
    logits, weights = model(torch.randint(0, 20, (2, 9)), return_attention=True)
    assert logits.shape == (2, 9, 20)
    assert len(weights) == 3
    for w in weights:
        assert w.shape == (2, 4, 9, 9)
        assert_close(w.sum(-1), torch.ones(2, 4, 9))
        assert (w.triu(1) == 0).all()


def test_an_unknown_ffn_is_rejected():
    with pytest.raises(ValueError, match="ffn"):
        GPT(20, ffn="None")
