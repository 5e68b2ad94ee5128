"""Every Part V option of `GPT` at once: chapters 14-16's choices combined keep the one
attention path exact (cached decoding equals the full pass, the future never leaks)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from attention_course import GPT

COMBINATIONS = [
    dict(pos="rope", num_kv_heads=2, window=5),
    dict(pos="alibi", num_kv_heads=1, window=4),
    dict(pos="rope", norm="rms", ffn="swiglu", num_kv_heads=2),
    dict(pos="alibi", norm="rms", ffn="swiglu", window=3),
]


@pytest.mark.parametrize(
    "options", COMBINATIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items())
)
def test_cached_steps_equal_the_full_pass(options):
    torch.manual_seed(0)
    model = GPT(20, d_model=32, num_heads=4, num_layers=2, max_len=64, **options).double().eval()
    ids = torch.randint(0, 20, (2, 12))
    full = model(ids)  # (B, T, V)
    cache = model.new_cache()
    steps = [model(ids[:, :6], cache=cache)]  # a prompt longer than every window here
    steps += [model(ids[:, t : t + 1], cache=cache) for t in range(6, 12)]
    assert_close(torch.cat(steps, dim=1), full)


@pytest.mark.parametrize(
    "options", COMBINATIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items())
)
def test_later_tokens_do_not_change_earlier_logits(options):
    torch.manual_seed(0)
    model = GPT(20, d_model=32, num_heads=4, num_layers=2, max_len=64, **options).double().eval()
    ids = torch.randint(0, 20, (1, 10))
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % 20
    assert_close(model(ids)[:, :6], model(changed)[:, :6])
    assert not torch.allclose(model(ids)[:, 6:], model(changed)[:, 6:])
