"""Validation at the entry points only (issue #28): a model's forward does not re-check, in
every head split, merge or key/value repeat, what its constructor and forward checked once."""

import collections
import sys

import pytest
import torch

from attention_course import GPT, merge_heads, repeat_kv, split_heads

HELPERS = {"split_heads", "merge_heads", "repeat_kv", "_check_heads"}


def _validate_callers(fn) -> collections.Counter:
    """Which functions call `attention_course._validate`'s checks, and how often."""
    callers = collections.Counter()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.endswith("attention_course/_validate.py"):
            callers[frame.f_back.f_code.co_name] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return callers


def test_a_gpt_forward_checks_no_shapes_inside_its_layers_helpers():
    torch.manual_seed(0)
    model = GPT(20, d_model=16, num_heads=4, num_layers=2, max_len=8, num_kv_heads=2)
    x = torch.randint(0, 20, (2, 8))
    callers = _validate_callers(lambda: model(x))
    assert not HELPERS & set(callers), callers
    # what remains: the entry checks of the modules a user can call (2 layers)
    assert sum(callers.values()) <= 12, callers


def test_the_public_helpers_still_check_their_input():
    with pytest.raises(ValueError, match="expected a divisor of d_model=10"):
        split_heads(torch.zeros(1, 2, 10), 3)
    with pytest.raises(ValueError, match=r"\(B, H, T, Dh\)"):
        merge_heads(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="n_rep"):
        repeat_kv(torch.zeros(1, 2, 3, 4), 0)


def test_a_gpt_user_gets_the_attention_modules_message():
    with pytest.raises(ValueError, match=r"each head gets d_model / num_heads features"):
        GPT(20, d_model=10, num_heads=3)
