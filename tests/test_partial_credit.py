"""Partial credit rewards only real work (issue #27).

Every checker of every released exercise is run on degenerate candidates
(``tests/degenerate.py``): a constant, the input returned unchanged, the reference's answer
transposed on its last two axes, the masks off by one, a fixed guess. Each must score
exactly 0: a case that such a candidate passes is a support case
(``Case(..., support=True)``), which counts only beside a passed case that is not one.
Honest partial credit stays: a solution right in the main cases and wrong in one extra
feature keeps the weight of what it gets right.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from attention_course.checks import CHECKERS, _runner
from attention_course.checks._registry import REGISTRY
from attention_course.checks._runner import Case, CaseFailed, run_cases

sys.path.insert(0, os.path.dirname(__file__))
import degenerate  # noqa: E402
from buggy import REFERENCES  # noqa: E402

# Generic candidates that, on some call of a checker, leave the reference's answer as it is
# (no input of the answer's shape, an answer that is not square or not a tensor): there
# they are the reference, not a degenerate answer. The test checks that each listed pair
# really does so, and that every other pair answers degenerately on every call.
NOT_DEGENERATE: dict[tuple[str, str], str] = {
    (
        "additive_attention",
        "input",
    ): "the answer is a tuple with a non-square part (context, weights)",
    (
        "additive_attention",
        "transposed",
    ): "the answer is a tuple with a non-square part (context, weights)",
    ("alibi_bias", "input"): "no tensor argument has the answer's shape (the slopes are (H,))",
    ("alibi_bias", "transposed"): "T != S in half of the calls: (H, T, S) not square",
    ("alibi_slopes", "input"): "the argument is an int",
    ("alibi_slopes", "transposed"): "the answer is 1-D (H,)",
    ("apply_rope", "transposed"): "the answer is not square on its last two axes (T, Dh)",
    ("attention_rollout", "input"): "the argument is a list of tensors",
    ("batch_norm", "transposed"): "the answer is not square on its last two axes",
    ("causal_mask", "input"): "the argument is an int",
    ("causal_self_attention", "transposed"): "the answer is not square on its last two axes (T, D)",
    ("decoder_layer", "input"): "with return_attention=True the answer is a tuple",
    ("decoder_layer", "transposed"): "the answer is not square on its last two axes (T, D)",
    ("encoder_layer", "input"): "with return_attention=True the answer is a tuple",
    ("encoder_layer", "transposed"): "the answer is not square on its last two axes (T, D)",
    ("filter_logits", "transposed"): "the answer is not square on its last two axes (B, V)",
    ("generate", "input"): "the answer is longer than the prompt (but for 0 new tokens)",
    ("generate", "transposed"): "the answer is not square on its last two axes (B, T)",
    ("induction_scores", "input"): "no tensor argument has the answer's shape (the answer is (H,))",
    ("induction_scores", "transposed"): "the answer is 1-D (H,)",
    ("layer_norm", "transposed"): "the answer is not square on its last two axes",
    ("merge_heads", "input"): "no tensor argument has the answer's shape",
    ("merge_heads", "transposed"): "the answer is not square on its last two axes (T, D)",
    ("multi_head_attention", "input"): "the answer is a tuple (output, weights)",
    (
        "multi_head_attention",
        "transposed",
    ): "the answer is a tuple with a non-square part (output, weights)",
    ("online_softmax_update", "input"): "the answer is a tuple (m, l, acc)",
    (
        "online_softmax_update",
        "transposed",
    ): "the answer is a tuple with a non-square part (m, l, acc)",
    ("padding_mask", "input"): "no tensor argument has the answer's shape (lengths are (B,))",
    ("padding_mask", "transposed"): "the answer is not square on its last two axes (B, max_len)",
    (
        "positionwise_feed_forward",
        "transposed",
    ): "the answer is not square on its last two axes in most calls (T, D)",
    ("repeat_kv", "input"): "with n_rep=1 the answer is the input itself",
    ("repeat_kv", "transposed"): "the answer is not square on its last two axes (S, Dh)",
    ("rms_norm", "transposed"): "the answer is not square on its last two axes",
    ("rolling_update", "input"): "the answer is a tuple",
    ("rolling_update", "transposed"): "the answer is a tuple with a non-square part",
    ("scaled_dot_product_attention", "input"): "the answer is a tuple (output, weights)",
    (
        "scaled_dot_product_attention",
        "transposed",
    ): "the answer is a tuple with a non-square part (output, weights)",
    ("set_attention", "input"): "the answer is a tuple (output, weights)",
    (
        "set_attention",
        "transposed",
    ): "the answer is a tuple with a non-square part (output, weights)",
    ("sinusoidal_positional_encoding", "input"): "the arguments are ints",
    (
        "sinusoidal_positional_encoding",
        "transposed",
    ): "the answer is not square on its last two axes (max_len, d_model)",
    ("sliding_window_mask", "input"): "the arguments are ints",
    ("soft_argmax", "transposed"): "the answer is not square on its last two axes",
    ("split_heads", "input"): "no tensor argument has the answer's shape",
    ("split_heads", "transposed"): "the answer is not square on its last two axes (T, Dh)",
    ("swiglu", "transposed"): "the answer is not square on its last two axes",
    ("tiled_attention_loop", "input"): "Dk != Dv: no tensor argument has the answer's shape",
    ("tiled_attention_loop", "transposed"): "the answer is not square on its last two axes",
    # exercises 18 and 19
    ("mla_absorbed_attention", "input"): "the answer is a tuple (output, q_absorbed)",
    (
        "mla_absorbed_attention",
        "transposed",
    ): "the answer is a tuple with non-square parts (output, q_absorbed)",
    (
        "multi_head_latent_attention",
        "transposed",
    ): "the answer is not square on its last two axes (T, D)",
    ("kv_cache_bytes", "zeros"): "the answer is an int, not a tensor",
    ("kv_cache_bytes", "ones"): "the answer is an int, not a tensor",
    ("kv_cache_bytes", "input"): "the answer is an int; no argument is a tensor",
    ("kv_cache_bytes", "transposed"): "the answer is an int, not a tensor",
    ("rope_frequencies", "input"): "the arguments are an int, a float and a dict",
    ("rope_frequencies", "transposed"): "the answer is a tuple (inv_freq (d/2,), factor)",
    ("scaled_rope_scores", "input"): "no tensor argument has the answer's shape (T, S)",
    ("scaled_rope_scores", "transposed"): "the answer is not square on its last two axes "
    "in the cases with S != T",
    ("streaming_mask", "input"): "the arguments are ints",
    ("sink_attention", "input"): "the answer is a tuple (output, weights)",
    (
        "sink_attention",
        "transposed",
    ): "the answer is a tuple with a non-square part (output, weights)",
    # exercises 20 and 21
    ("qk_norm_attention", "transposed"): "T != Dh in every case: (T, Dh) is not square",
    ("softcap_attention", "transposed"): "T != Dh in every case: (T, Dh) is not square",
    ("moe", "input"): "the answer is a tuple (out, router_logits)",
    ("moe", "transposed"): "the answer is a tuple (out, router_logits), not square",
    ("load_balancing_loss", "input"): "the answer is a scalar: no argument has its shape",
    ("load_balancing_loss", "transposed"): "the answer is a scalar (0-d)",
    # exercise 22
    ("linear_attention", "input"): "the answer (..., T, Dv) has the query's shape only where "
    "Dk = Dv",
    ("linear_attention", "transposed"): "T != Dv in most cases: (T, Dv) is not square",
    ("gated_delta_rule", "input"): "the answer is a tuple (output, state)",
    ("gated_delta_rule", "transposed"): "the answer is a tuple (output (B, T, H, Dv), state)",
    # exercise 23
    ("merge_partials", "input"): "the answer is a tuple (m, l, acc), the arguments tuples",
    (
        "merge_partials",
        "transposed",
    ): "the answer is a tuple with non-square parts (m and l are (..., T, 1))",
    (
        "simulated_ring_attention",
        "input",
    ): "the answer is a list of W shards, the arguments lists",
    (
        "simulated_ring_attention",
        "transposed",
    ): "the shards (..., n, Dv) are square only where n = Dv",
}


def _pairs():
    pairs = []
    for target, reference in REFERENCES.items():
        for name in degenerate.candidates(target, reference):
            pairs.append(pytest.param(target, name, id=f"{target}-{name}"))
    return pairs


def _degenerate_cases_fail(target, candidate):
    """Case by case, for a candidate that is the reference on some calls: a case in which
    every call got a degenerate answer fails, or is a support case."""
    captured = []

    def capture(_target, cases, timeout):
        captured.extend(cases)
        return _runner.Report(target=f"check_{_target}")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_runner, "run_cases", capture)
        CHECKERS[target](candidate)
    tally = candidate.tally
    weak = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for case in captured:
            calls, kept = tally.calls, tally.kept
            try:
                case.run()
            except Exception:  # noqa: BLE001 - a failed case, whatever it raised
                continue
            calls, kept = tally.calls - calls, tally.kept - kept
            if calls and kept == calls and not case.support:
                weak.append(case.name)
    assert not weak, f"{target}/{candidate.degenerate} passes {weak} with degenerate answers"


def test_every_released_checker_is_audited():
    graded = {c.target for c in REGISTRY if c.exercise is not None}
    assert graded <= set(REFERENCES) == set(CHECKERS)


@pytest.mark.parametrize(("target", "name"), _pairs())
def test_a_degenerate_candidate_scores_zero(target, name):
    candidate = degenerate.candidates(target, REFERENCES[target])[name]
    report = CHECKERS[target](candidate)
    tally = getattr(candidate, "tally", None)
    if tally is not None:
        if (target, name) in NOT_DEGENERATE:
            assert not tally.every_call, f"{target}/{name} is degenerate on every call now"
            _degenerate_cases_fail(target, candidate)
            return
        assert tally.every_call, (
            f"{target}/{name}: {tally.calls - tally.kept} of {tally.calls} calls kept the "
            "reference's answer; list the pair in NOT_DEGENERATE with the reason"
        )
    passed = [r.name for r in report.results if r.passed and r.weight > 0]
    assert report.score == 0, f"{target}/{name} scores {report.score:.3f}, through {passed}"
    assert not report.passed


# ---------------------------------------------------------------- the scheme itself


def _ok():
    return None


def _fail():
    raise CaseFailed("wrong")


def test_support_cases_count_only_beside_a_passed_main_case():
    only_support = run_cases(
        "demo",
        [
            Case("main", _fail),
            Case("device", _ok, support=True),
            Case("size 1", _ok, 0.25, support=True),
        ],
        timeout=5,
    )
    assert only_support.score == 0 and only_support.num_passed == 2
    assert [r.weight for r in only_support.results] == [1.0, 0.0, 0.0]
    assert only_support.to_dict()["score"] == 0

    with_work = run_cases(
        "demo",
        [Case("main", _ok), Case("other", _fail), Case("device", _ok, support=True)],
        timeout=5,
    )
    assert [r.weight for r in with_work.results] == [1.0, 1.0, 1.0]
    assert with_work.score == pytest.approx(2 / 3)

    honest_but_no_device = run_cases(
        "demo",
        [Case("main", _ok), Case("device", _fail, support=True)],
        timeout=5,
    )
    assert honest_but_no_device.score == 0.5  # a support case it fails still counts


# ---------------------------------------------------------------- honest partial credit

# Mistakes of the catalogue (tests/buggy) that are right in the main cases and wrong in one
# extra feature, with the score each had before issue #27: they keep it.
HONEST = {
    ("causal_mask", "ignores device"): 0.7778,
    ("padding_mask", "tensor only"): 0.6923,
    ("padding_mask", "ignores the device"): 0.8462,
    ("scaled_dot_product_attention", "ignores dropout"): 0.8710,  # 0.8621 before the B = 1 case
    ("multi_head_attention", "dropout in eval mode"): 0.7647,
    ("batch_norm", "batch stats in eval"): 0.7,
    ("positionwise_feed_forward", "always relu"): 0.7241,
    ("encoder_layer", "ignores mask"): 0.3455,
    ("encoder_layer", "no residual dropout"): 0.8545,
    ("decoder_layer", "always pre-norm"): 0.3889,
    ("decoder_layer", "memory_mask ignored in pre-norm"): 0.7037,
    ("causal_self_attention", "dropout ignored"): 0.8947,
    ("sliding_window_mask", "no ValueError"): 0.8788,
}


def _catalogued(target, name):
    from buggy import CATALOGUE

    (impl,) = [i for t, n, i, _ in CATALOGUE if (t, n) == (target, name)]
    return impl


@pytest.mark.parametrize(
    ("target", "name"), [pytest.param(*key, id="-".join(key)) for key in HONEST]
)
def test_honest_partial_credit_keeps_its_score(target, name):
    report = CHECKERS[target](_catalogued(target, name))
    assert not report.passed
    assert report.score == pytest.approx(HONEST[target, name], abs=1e-4)
    assert all(r.weight > 0 for r in report.results)  # no support case was set to 0


def test_attention_that_ignores_the_scores_earns_nothing():
    # a simulated student's degenerate answers: the identity for set attention (H = X),
    # uniform weights for scaled dot-product attention (0.34/2 and 0.21/3 before)
    from attention_course.checks import check_scaled_dot_product_attention, check_set_attention

    def identity(X, beta=1.0):
        T = X.shape[-2]
        return X.clone(), torch.eye(T, dtype=X.dtype).expand(*X.shape[:-2], T, T).clone()

    def uniform(query, key, value, mask=None, dropout_p=0.0, scale=None):
        S = key.shape[-2]
        weights = torch.full((*query.shape[:-1], S), 1.0 / S, dtype=query.dtype)
        return weights @ value, weights

    assert check_set_attention(identity).score == 0
    assert check_scaled_dot_product_attention(uniform).score == 0
