"""Chapter 17's helpers for finding and ablating heads (attention_course.interpret)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from attention_course import GPT
from attention_course.data import repeated_tokens
from attention_course.interpret import (
    ablate_heads,
    ablation_effect,
    find_induction_head,
    second_half_loss,
    train_induction_model,
)


def _model():
    torch.manual_seed(0)
    return GPT(12, d_model=16, num_heads=4, num_layers=2, ffn="none", pos="rope").double().eval()


def test_second_half_loss_is_the_cross_entropy_of_the_copyable_tokens():
    model = _model()
    ids = repeated_tokens(3, 5, 12, torch.Generator().manual_seed(0))  # (3, 10)
    logits = model(ids)
    by_hand = torch.stack(
        [F.cross_entropy(logits[b, t], ids[b, t + 1]) for b in range(3) for t in range(5, 9)]
    ).mean()
    assert_close(second_half_loss(model, ids, 5), by_hand)


def test_ablating_every_head_leaves_the_direct_path_and_restores_the_weights():
    model = _model()
    ids = torch.randint(0, 12, (2, 7))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    every = [(layer, head) for layer in range(2) for head in range(4)]
    with torch.no_grad(), ablate_heads(model, every):
        got = model(ids)
    assert_close(got, model.head(model.norm(model.tok_emb(ids))))
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_ablating_a_head_equals_zeroing_its_attention_output():
    model = _model()
    ids = torch.randint(0, 12, (2, 7))
    attn = model.blocks[1].attn
    Dh = 4

    def zero_head(module, args):  # the concatenated heads, before w_o
        (x,) = args
        x = x.clone()
        x[..., 2 * Dh : 3 * Dh] = 0.0
        return (x,)

    handle = attn.w_o.register_forward_pre_hook(zero_head)
    with torch.no_grad():
        expected = model(ids)
    handle.remove()
    with torch.no_grad(), ablate_heads(model, [(1, 2)]):
        got = model(ids)
    assert_close(got, expected)
    ids3 = repeated_tokens(2, 4, 12, torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = _loss_with(model, ids3, (1, 2)) - second_half_loss(model, ids3, 4).item()
    assert abs(ablation_effect(model, ids3, 4, 1, 2) - expected) < 1e-12


def _loss_with(model, ids, head):
    with ablate_heads(model, [head]):
        return second_half_loss(model, ids, 4).item()


class _Planted(nn.Module):
    """Returns planted attention weights: a perfect induction head at (layer 1, head 2)."""

    def forward(self, ids, return_attention=False):
        B, T = ids.shape
        uniform = torch.ones(T, T).tril()
        uniform = (uniform / uniform.sum(-1, keepdim=True)).expand(B, 3, T, T).clone()
        second = uniform.clone()
        period = T // 2
        second[:, 2] = 0.0
        for i in range(T):
            second[:, 2, i, i - period + 1 if i >= period else 0] = 1.0
        return torch.zeros(B, T, 5), [uniform, second]


def test_find_induction_head_returns_the_planted_head():
    ids = repeated_tokens(2, 6, 5, torch.Generator().manual_seed(0))
    assert find_induction_head(_Planted(), ids, 6) == (1, 2)


def test_train_induction_model_returns_fresh_copies_of_one_training():
    a = train_induction_model(seed=3, num_steps=2)
    b = train_induction_model(seed=3, num_steps=2)
    assert a is not b and not a.training
    for (k, v), w in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(v, w), k
    with torch.no_grad():
        a.blocks[0].attn.w_o.weight.zero_()  # changing one copy leaves the next untouched
    c = train_induction_model(seed=3, num_steps=2)
    assert torch.equal(c.blocks[0].attn.w_o.weight, b.blocks[0].attn.w_o.weight)
    assert all(block.ffn is None for block in c.blocks)


def _first_failure(report) -> str:
    return next(r.message for r in report.results if not r.passed)


def test_find_checker_accepts_zero_dim_tensors_and_names_the_first_mistake():
    import os
    import sys

    from attention_course.checks import check_find_induction_head, check_induction_scores

    sys.path.insert(0, os.path.dirname(__file__))
    from buggy.interpret import find_argmin, find_divmod_by_layers, induction_transposed

    def as_tensors(model, ids, period):
        layer, head = find_induction_head(model, ids, period)
        return torch.tensor(layer), torch.tensor(head)

    assert check_find_induction_head(as_tensors).passed
    assert "lowest" in _first_failure(check_find_induction_head(find_argmin))
    assert "num_heads" in _first_failure(check_find_induction_head(find_divmod_by_layers))
    assert "transposed" in _first_failure(check_induction_scores(induction_transposed))


def test_find_checker_rejects_a_scan_of_one_layer_and_names_it():
    """Issue 24: scanning only the last layer passed 5/5 (every case's best head was in
    the last layer). Two cases now grow the model by a layer that writes nothing."""
    import os
    import sys

    from attention_course.checks import check_find_induction_head

    sys.path.insert(0, os.path.dirname(__file__))
    from buggy.interpret import find_last_layer_only, find_layer_one_only

    report = check_find_induction_head(find_last_layer_only)
    assert not report.passed
    assert [r.passed for r in report.results][:5] == [True] * 5  # right on two layers
    message = _first_failure(report)
    assert "you scanned only the last layer" in message and "returned (2, 2)" in message
    report = check_find_induction_head(find_layer_one_only)
    assert not report.passed
    assert "you scanned only layer 1" in _first_failure(report)


def test_checker_cases_with_an_idle_layer_keep_the_models_function():
    """The grown models compute what the shipped model computes (the idle layer's w_o is
    zero), and their best head is not in their last layer / not in layer 1."""
    from attention_course.checks.interpret import _eval_ids, _scores, _variant
    from attention_course.interpret import load_induction_model

    model = load_induction_model()
    ids = _eval_ids(16)
    for name, best_layer in (("idle layer at the end", 1), ("idle layer at the start", 2)):
        grown = _variant(name)
        assert grown.num_layers == 3
        with torch.no_grad():
            assert torch.equal(grown(ids), model(ids))
        assert find_induction_head(grown, ids, 16)[0] == best_layer
        assert _scores(grown, ids, 16, 15).shape == (3, 4)
