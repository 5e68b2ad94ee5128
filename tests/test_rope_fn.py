"""`rope_fn`: the rotation of queries and keys is a piece the model is given (chapter 14
swaps the layout through it instead of patching the package)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from attention_course import GPT, CausalSelfAttention, apply_rope


def interleaved(x, positions):
    # RoFormer / GPT-J layout: feature 2i paired with 2i + 1
    Dh = x.shape[-1]
    i = torch.arange(Dh // 2, dtype=torch.float64)
    angles = positions.double()[:, None] * 10000.0 ** (-2 * i / Dh)  # (T, Dh/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


def _model(**kwargs):
    torch.manual_seed(0)
    return GPT(20, d_model=32, num_heads=4, num_layers=2, max_len=64, pos="rope", **kwargs)


def test_default_rotation_is_apply_rope():
    ids = torch.randint(0, 20, (2, 11), generator=torch.Generator().manual_seed(1))
    given = _model(rope_fn=apply_rope).double().eval()
    default = _model().double().eval()
    assert_close(given(ids), default(ids), rtol=0, atol=0)


def test_interleaved_layout_with_permuted_rows_equals_half_split():
    # The same rotation up to a permutation of the features: permuting each head's
    # rows of w_q and w_k makes the interleaved model compute the half-split model.
    ids = torch.randint(0, 20, (2, 13), generator=torch.Generator().manual_seed(2))
    half = _model().double().eval()
    with torch.no_grad():  # sharp attention, so that the layout shows in the logits
        for block in half.blocks:
            block.attn.w_q.weight.mul_(50.0)
            block.attn.w_k.weight.mul_(50.0)
    inter = _model(rope_fn=interleaved).double().eval()
    inter.load_state_dict(half.state_dict())
    assert not torch.allclose(inter(ids), half(ids), atol=1e-3)  # the layout matters
    Dh, H = 8, 4
    order = torch.stack([torch.arange(Dh // 2), torch.arange(Dh // 2) + Dh // 2], 1).flatten()
    with torch.no_grad():
        for block in inter.blocks:
            for proj in (block.attn.w_q, block.attn.w_k):
                w = proj.weight
                w.copy_(w.view(H, Dh, -1)[:, order].reshape(H * Dh, -1))
    assert_close(inter(ids), half(ids))


def test_rope_fn_gets_the_heads_and_the_absolute_positions_with_a_cache():
    seen = []

    def spy(x, positions):
        seen.append((tuple(x.shape), positions.tolist()))
        return apply_rope(x, positions)

    model = _model(rope_fn=spy, num_kv_heads=2).eval()
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(0, 20, (1, 3)), cache=cache)
        model(torch.randint(0, 20, (1, 1)), cache=cache)
    # per layer: queries (B, H, T, Dh), then keys (B, Hkv, T, Dh)
    assert seen[:2] == [((1, 4, 3, 8), [0, 1, 2]), ((1, 2, 3, 8), [0, 1, 2])]
    assert seen[-2:] == [((1, 4, 1, 8), [3]), ((1, 2, 1, 8), [3])]
    config = model.config()
    assert isinstance(config["rope_fn"], str) and config["rope_fn"].endswith("spy")
    assert GPT(**{**config, "rope_fn": spy}).rope_fn is spy


@pytest.mark.parametrize("pos", ["learned", "alibi", "none"])
def test_rope_fn_without_rope_positions_is_refused(pos):
    with pytest.raises(ValueError, match="rope_fn"):
        GPT(20, d_model=32, num_heads=4, pos=pos, rope_fn=apply_rope)


def test_rope_fn_must_be_callable():
    with pytest.raises(ValueError, match="rope_fn"):
        CausalSelfAttention(32, 4, pos="rope", rope_fn="interleaved")


def test_default_model_saves_and_loads_with_weights_only(tmp_path):
    model = _model().eval()
    path = tmp_path / "gpt.pt"
    torch.save({"config": model.config(), "state_dict": model.state_dict()}, path)
    data = torch.load(path, weights_only=True)
    again = GPT(**data["config"])
    again.load_state_dict(data["state_dict"])
    ids = torch.randint(0, 20, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert_close(again.eval()(ids), model(ids))


def test_custom_rope_fn_is_stored_by_name_and_must_be_given_again(tmp_path):
    model = _model(rope_fn=interleaved).eval()
    config = model.config()
    assert config["rope_fn"] == "interleaved"
    path = tmp_path / "gpt.pt"  # a closure or a lambda would not even pickle: the name does
    torch.save({"config": config, "state_dict": model.state_dict()}, path)
    data = torch.load(path, weights_only=True)
    with pytest.raises(ValueError, match="rope_fn: got the name 'interleaved'"):
        GPT(**data["config"])
    again = GPT(**{**data["config"], "rope_fn": interleaved})
    again.load_state_dict(data["state_dict"])
    ids = torch.randint(0, 20, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert_close(again.eval()(ids), model(ids))
