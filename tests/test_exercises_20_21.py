"""Exercises 20 and 21: the checkers' references are the package's (CausalSelfAttention with
``qk_norm`` / ``softcap``, ``MoE``, ``load_balancing_loss``), the right answers written
another way pass (a softmax over the top-k logits, every expert run on every token, the
loss from a dense mask), verdicts do not depend on the run seed (no tie decides a top-k),
and the quizzes' answers are what their statements derive. The buggy implementations
(tests/buggy/logit_range.py, tests/buggy/moe.py) run in tests/test_checks.py."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
import torch

import attention_course as ac
from attention_course.checks import (
    check_load_balancing_loss,
    check_moe,
    check_qk_norm_attention,
    check_softcap_attention,
)
from attention_course.checks._mistakes import MISTAKES
from attention_course.checks.logit_range import qk_norm_reference, softcap_reference
from attention_course.checks.moe import _clear_choice
from attention_course.checks.quiz_computed import MOE_CONFIGS, moe_parameters_reference
from attention_course.quiz import QUESTIONS, check_quiz, decode

sys.path.insert(0, os.path.dirname(__file__))
from buggy import logit_range, moe  # noqa: E402


def _randomised(module, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(1.0 + 0.4 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            if p.dim() > 1:
                p.copy_(
                    torch.randn(p.shape, generator=gen, dtype=torch.float64) / p.shape[-1] ** 0.5
                )
    return module


def _heads(x, H):
    B, T, D = x.shape
    return x.view(B, T, H, D // H).transpose(1, 2)  # (B, T, D) -> (B, H, T, Dh)


def test_qk_norm_reference_is_the_packages_attention():
    """q_norm and k_norm per head, then RoPE, then causal attention: CausalSelfAttention
    with pos="rope", qk_norm=True, before its output projection."""
    attn = _randomised(ac.CausalSelfAttention(24, 3, pos="rope", qk_norm=True), 0).double()
    attn.eval()
    x = torch.randn(2, 7, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    q, k, v = (_heads(w(x), 3) for w in (attn.w_q, attn.w_k, attn.w_v))
    heads = qk_norm_reference(q, k, v, attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.eps)
    ours = attn.w_o(heads.transpose(1, 2).reshape(2, 7, 24))
    torch.testing.assert_close(ours, attn(x), atol=1e-12, rtol=1e-12)
    assert attn.q_norm.eps == 1e-6  # the statement's default


def test_softcap_reference_is_the_packages_attention():
    attn = _randomised(ac.CausalSelfAttention(16, 2, softcap=3.0), 2).double().eval()
    x = 3 * torch.randn(2, 6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    q, k, v = (_heads(w(x), 2) for w in (attn.w_q, attn.w_k, attn.w_v))
    ours = attn.w_o(softcap_reference(q, k, v, 3.0).transpose(1, 2).reshape(2, 6, 16))
    torch.testing.assert_close(ours, attn(x), atol=1e-12, rtol=1e-12)


def test_the_norm_placement_shows_only_with_a_gain():
    """With gains of ones, norm-then-RoPE equals RoPE-then-norm (a rotation keeps the
    length): the checker's gains must be far from ones, as the statement says."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=torch.float64, generator=gen) for _ in range(3))
    ones = torch.ones(8, dtype=torch.float64)
    right = qk_norm_reference(q, k, v, ones, ones)
    torch.testing.assert_close(logit_range.qk_norm_after_rope(q, k, v, ones, ones), right)
    gain = 1 + 0.5 * torch.randn(8, dtype=torch.float64, generator=gen)
    assert not torch.allclose(
        logit_range.qk_norm_after_rope(q, k, v, gain, gain), qk_norm_reference(q, k, v, gain, gain)
    )


def test_moe_and_loss_references_are_the_packages():
    """The contract's MoE, with F.rms_norm-free helpers: the buggy catalogue's base class
    (every expert on every token, weights zero outside the top-k) is a correct MoE."""
    ref = ac.MoE(8, 6, 4, top_k=2, num_shared=1).double()
    dense = moe._MoEBase(8, 6, 4, top_k=2, num_shared=1).double()
    dense.load_state_dict(ref.state_dict())
    x = torch.randn(2, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    for a, b in zip(dense(x), ref(x), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "candidate",
    [moe._MoEBase, moe.MoESoftmaxOverTopK, ac.MoE],
    ids=["every expert on every token", "softmax over the top-k logits", "the package"],
)
def test_right_moes_pass(candidate):
    report = check_moe(candidate)
    assert report.passed, str(report)


class _ArgsortMoE(moe._MoEBase):
    """Right, with the experts chosen by argsort (another order among the chosen, the same
    set: no tie in the checker's inputs makes the two selections differ)."""

    def weights(self, logits):
        probs = logits.softmax(-1)
        idx = probs.argsort(dim=-1, descending=True)[:, : self.top_k]
        w = probs.gather(-1, idx)
        return torch.zeros_like(probs).scatter(-1, idx, w / w.sum(-1, keepdim=True))


@pytest.mark.parametrize("seed", [0, 1, 7, 12345])
def test_verdicts_do_not_depend_on_the_run_seed(seed):
    for check, right in [
        (check_moe, ac.MoE),
        (check_moe, _ArgsortMoE),
        (check_load_balancing_loss, ac.load_balancing_loss),
        (check_load_balancing_loss, moe.reference_balance_softmax_over_top_k),
        (check_qk_norm_attention, qk_norm_reference),
        (check_softcap_attention, softcap_reference),
    ]:
        report = check(right, seed=seed)
        assert report.passed, f"seed {seed}: {report}"
    for check, wrong, mistake in [
        (check_moe, moe.MoENotRenormalised, "moe-weights-not-renormalised"),
        (check_moe, moe.MoEPerSequence, "moe-routing-per-sequence"),
        (check_load_balancing_loss, moe.balance_first_slot, "balance-first-slot-only"),
        (check_qk_norm_attention, logit_range.qk_norm_after_rope, "qk-norm-after-rope"),
        (check_softcap_attention, logit_range.softcap_after_mask, "softcap-after-mask"),
    ]:
        report = check(wrong, seed=seed)
        assert not report.passed and mistake in report.mistakes, f"seed {seed}: {report}"


def test_a_tie_cannot_reach_the_checker():
    """Inputs with a k-th and (k+1)-th probability closer than the margin are redrawn."""
    tie = torch.tensor([[0.4, 0.3, 0.3], [0.5, 0.3, 0.2]], dtype=torch.float64)
    assert _clear_choice(tie, 1)  # k=1: 0.4 against 0.3, 0.5 against 0.3
    assert not _clear_choice(tie, 2)  # 0.3 and 0.3 at the 2nd and 3rd place
    assert _clear_choice(tie, 3)  # every expert: nothing to choose


def test_the_mistake_ids_of_both_exercises_are_in_the_table():
    for entry in [*logit_range.CATALOGUE, *moe.CATALOGUE]:
        assert entry[3] is None or entry[3] in MISTAKES, entry


# ---------------------------------------------------------------- quizzes


def test_moe_parameters_reference_counts_the_modules_parameters():
    for config in MOE_CONFIGS:
        D, F, E, k, S = config
        if D * F > 100_000:
            continue  # Mixtral's layer: 1.4 billion numbers; the formula is the same
        layer = ac.MoE(D, F, E, top_k=k, num_shared=S)
        total, active = moe_parameters_reference(*config)
        assert total == sum(p.numel() for p in layer.parameters())
        per_expert = sum(p.numel() for p in layer.experts[0].parameters())
        shared = 0 if layer.shared is None else sum(p.numel() for p in layer.shared.parameters())
        assert active == layer.router.weight.numel() + k * per_expert + shared


def test_mixtral_layer_count():
    """Mixtral 8x7B's MoE layer: 8 experts of 3 * 4096 * 14336, and the router."""
    total, active = moe_parameters_reference(4096, 14336, 8, 2, 0)
    assert total == 8 * 3 * 4096 * 14336 + 4096 * 8 == 1_409_318_912
    assert active == 2 * 3 * 4096 * 14336 + 4096 * 8 == 352_354_304


def test_moe_parameters_accepts_numpy_and_torch_integers_and_names_mistakes():
    def as_numpy(D, F, E, k, S):
        return tuple(np.int64(v) for v in moe_parameters_reference(D, F, E, k, S))

    def as_torch(D, F, E, k, S):
        return tuple(torch.tensor(v) for v in moe_parameters_reference(D, F, E, k, S))

    def as_float(D, F, E, k, S):
        return tuple(float(v) for v in moe_parameters_reference(D, F, E, k, S))

    for answer in (as_numpy, as_torch, as_float):
        assert check_quiz("21.moe_parameters", answer).passed

    def swapped(D, F, E, k, S):
        return moe_parameters_reference(D, F, E, k, S)[::-1]

    def two_matrices(D, F, E, k, S):
        return 2 * D * F * (E + S) + D * E, 2 * D * F * (k + S) + D * E

    def no_shared(D, F, E, k, S):
        return 3 * D * F * E + D * E, 3 * D * F * k + D * E

    for wrong, phrase in [
        (swapped, "swapped"),
        (two_matrices, "three matrices"),
        (no_shared, "shared experts are not counted"),
    ]:
        report = check_quiz("21.moe_parameters", wrong)
        assert not report.passed and phrase in str(report), str(report)


def test_capped_weights_answer_is_the_limit_of_capped_softmax():
    """One score at +cap and seven at -cap (the limits of cap * tanh) give the stored
    answer; a row of huge scores, capped, approaches it."""
    largest, smallest = decode("20.capped_weights", QUESTIONS["20.capped_weights"].answer)
    cap = torch.tensor(5.0, dtype=torch.float64)
    scores = torch.tensor([1e6] + [-1e6] * 7, dtype=torch.float64)
    weights = (cap * torch.tanh(scores / cap)).softmax(-1)
    assert math.isclose(weights[0].item(), largest, rel_tol=1e-9)
    low = (cap * torch.tanh(-scores / cap)).softmax(-1)[0].item()
    assert math.isclose(low, smallest, rel_tol=1e-9)
    assert check_quiz("20.capped_weights", lambda: (largest, smallest)).passed
    half_gap = check_quiz(
        "20.capped_weights", lambda: (1 / (1 + 7 * math.exp(-5)), 1 / (1 + 7 * math.exp(5)))
    )
    assert not half_gap.passed and "2 * cap = 10" in str(half_gap)


# ---------------------------------------------------------------- the simulated student's findings


def _first_failure(report):
    return next(r for r in report.results if not r.passed)


def test_one_token_is_a_case_of_check_moe():
    """W1: a layer that breaks only when N = B*T = 1 (every decoding step at batch 1)
    fails the (1, 1, D) case, the only one it fails."""
    report = check_moe(moe.MoESqueezed)
    failed = [r.name for r in report.results if not r.passed]
    assert failed and all("B=T=1" in name for name in failed), str(report)


def test_a_largest_weight_of_one_is_not_the_capped_limit():
    """W2: 1 is within 0.1 % of 0.99968 but is the uncapped answer: the largest is compared
    by its distance from 1, and a weight of 1 is refused by name."""
    largest, smallest = decode("20.capped_weights", QUESTIONS["20.capped_weights"].answer)
    uncapped = check_quiz("20.capped_weights", lambda: (1.0, smallest))
    assert not uncapped.passed and "strictly between" in str(uncapped), str(uncapped)
    rounded = check_quiz("20.capped_weights", lambda: (round(largest, 5), smallest))
    assert not rounded.passed, str(rounded)  # 1 - 0.99968 is 0.5 % off 1 - largest
    assert check_quiz("20.capped_weights", lambda: (largest, smallest * 1.0009)).passed
    assert check_quiz("20.capped_weights", lambda: np.array([largest, smallest])).passed


@pytest.mark.parametrize(
    "check, wrong",
    [
        (check_qk_norm_attention, logit_range.qk_norm_float32_round_trip),
        (check_moe, moe.MoEFloat32Router),
        (check_load_balancing_loss, moe.balance_float32_mask),
    ],
    ids=["Qwen3's RMSNorm in float32", "Mixtral's float32 softmax", "one_hot(...).float()"],
)
def test_a_float32_round_trip_fails_and_its_message_leads_with_the_rule(check, wrong):
    """W3: the course is float64-strict (`_compare.TOLERANCES`); the statements say "keep
    float64: no float32 round trip", and the first failing case's hint begins with it."""
    report = check(wrong)
    assert not report.passed
    message = _first_failure(report).message
    assert "\nHint: keep float64: no float32 round trip." in message, message


def test_the_statements_say_keep_float64():
    import nbformat

    root = os.path.join(os.path.dirname(__file__), "..", "exercises")
    for name, tasks in [("20_logits_in_range.ipynb", 2), ("21_mixture_of_experts.ipynb", 2)]:
        for folder in (root, os.path.join(root, "solutions")):
            text = "\n".join(c.source for c in nbformat.read(os.path.join(folder, name), 4).cells)
            assert text.count("Keep float64: no float32 round trip") == tasks, name


@pytest.mark.parametrize(
    "check, wrong, mistake",
    [
        (check_qk_norm_attention, logit_range.qk_norm_eps_outside, "qk-norm-eps-outside-root"),
        (check_moe, moe.MoEPerSequenceMeanToken, "moe-routing-per-sequence"),
        (check_moe, moe.MoEPerSequence, "moe-routing-per-sequence"),
        (check_moe, moe.MoETopKOverTokensPerToken, "moe-top-k-over-tokens"),
        (check_moe, moe.MoETopKOverTokens, "moe-top-k-over-tokens"),
        (check_moe, moe.MoESharedTopWeight, "moe-shared-weighted"),
        (
            check_load_balancing_loss,
            moe.balance_p_renormalised_top_k,
            "balance-p-from-renormalised-top-k",
        ),
        (check_load_balancing_loss, moe.balance_sums, "balance-sums-for-means"),
        (
            check_qk_norm_attention,
            logit_range.qk_norm_scale_one_over_dh,
            "qk-norm-scale-one-over-dh",
        ),
        (
            check_qk_norm_attention,
            logit_range.qk_norm_mask_hides_diagonal,
            "causal-mask-hides-diagonal",
        ),
        (check_qk_norm_attention, logit_range.qk_norm_mask_sees_next, "causal-mask-sees-next"),
        (check_qk_norm_attention, logit_range.qk_norm_mask_transposed, "causal-mask-inverted"),
        (
            check_softcap_attention,
            logit_range.softcap_mask_hides_diagonal,
            "causal-mask-hides-diagonal",
        ),
        (check_softcap_attention, logit_range.softcap_mask_sees_next, "causal-mask-sees-next"),
        (check_softcap_attention, logit_range.softcap_mask_transposed, "causal-mask-inverted"),
    ],
)
def test_the_first_failing_case_names_the_mistake(check, wrong, mistake):
    """The report says "fix the first ✗ case": that case names the mistake (an eps outside
    the square root is first named, by the eps=0.1 case, not blamed on float32)."""
    first = _first_failure(check(wrong))
    assert first.mistake == mistake, first.message


def test_moe_parameters_names_active_without_shared_rounding_and_takes_arrays():
    def active_without_shared(D, F, E, k, S):
        total, _ = moe_parameters_reference(D, F, E, k, S)
        return total, 3 * D * F * k + D * E

    report = check_quiz("21.moe_parameters", active_without_shared)
    assert not report.passed and "counted in the total but not in the active" in str(report)

    def rounded(D, F, E, k, S):
        return tuple(float(f"{v:.3g}") for v in moe_parameters_reference(D, F, E, k, S))

    report = check_quiz("21.moe_parameters", rounded)
    assert not report.passed and "give exact integers" in str(report), str(report)
    assert "1410000000.0" in str(report)  # the float shown as the float it is

    for as_array in (np.array, torch.tensor):
        report = check_quiz(
            "21.moe_parameters", lambda *c, f=as_array: f(moe_parameters_reference(*c))
        )
        assert report.passed, str(report)
