"""Exercise 22 (attention with a fixed-size state): the checkers of linear attention and the
gated delta rule, their mistake simulators, and the computed question 22.state_or_cache.

The catalogue (`tests/buggy/linear.py`) is run by tests/test_checks.py (each mistake
rejected and named) and tests/test_seed.py (the same verdicts under several run seeds);
here: the simulators without a mistake are the package's functions, every mistake is named
by the first failing case under many run seeds, the float32 round trip is told the rule,
the quiz's formulas and drawn configurations, and a solution that calls the package's
reference fails the check cell and the grader alike.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import attention_course as ac
from attention_course.checks import check_gated_delta_rule, check_linear_attention
from attention_course.checks.linear import _delta_inputs, _delta_variant, _linear_variant
from attention_course.checks.quiz_computed import (
    QWEN3_NEXT,
    STATE_CACHE_CASES,
    _drawn_state_config,
    state_or_cache_reference,
)
from attention_course.quiz import check_quiz

sys.path.insert(0, os.path.dirname(__file__))
from buggy import linear  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHECKS = {"linear_attention": check_linear_attention, "gated_delta_rule": check_gated_delta_rule}


# ---------------------------------------------------------------- the simulators


@pytest.mark.parametrize("causal, T, S", [(True, 6, 6), (False, 6, 6), (False, 3, 8)])
def test_the_linear_simulator_is_the_packages_function(causal, T, S):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, T, 4, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, S, 4, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, S, 5, generator=g, dtype=torch.float64)
    torch.testing.assert_close(
        _linear_variant(q, k, v, causal), ac.linear_attention(q, k, v, causal=causal)
    )


@pytest.mark.parametrize("initial", [False, True])
def test_the_delta_simulator_is_the_packages_function(initial):
    q, k, v, g, beta, state = _delta_inputs(2, 7, 3, 4, 5, 11, initial=initial, plain=False)
    out, final = _delta_variant(q, k, v, g, beta, state)
    want_out, want_final = ac.gated_delta_rule(q, k, v, g, beta, initial_state=state)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(final, want_final)


def test_the_right_recurrences_pass():
    assert check_linear_attention(linear.linear_right).passed
    assert check_gated_delta_rule(linear.delta_right).passed
    assert check_linear_attention(ac.linear_attention).score == 1.0
    assert check_gated_delta_rule(ac.gated_delta_rule).score == 1.0


def test_the_packages_chunked_form_passes_too():
    """The check compares values: the package's chunked delta rule (one triangular solve per
    chunk) agrees with the recurrence to float64's precision."""

    def chunked(query, key, value, g, beta, initial_state=None):
        return ac.gated_delta_rule(query, key, value, g, beta, initial_state, chunk_size=3)

    report = check_gated_delta_rule(chunked)
    assert report.passed, str(report)


# ---------------------------------------------------------------- every mistake, every seed

SEEDS = [0, 1, 2, 3, 5, 8, 13, 21, 977, 12345, 2**31 - 2]


@pytest.mark.parametrize(
    "target, name, impl, mistake",
    [entry for entry in linear.CATALOGUE if entry[3] is not None],
    ids=[entry[1] for entry in linear.CATALOGUE if entry[3] is not None],
)
def test_the_first_failing_case_names_the_mistake_under_every_seed(target, name, impl, mistake):
    """A mistake must show under every run seed (the grader draws one per run), and the
    first ✗ case, the one the report says to fix first, names it."""
    for seed in SEEDS:
        report = CHECKS[target](impl, seed=seed)
        first = next(r for r in report.results if not r.passed)
        assert first.mistake == mistake, f"seed {seed}: {first.name}: {first.message}"


@pytest.mark.parametrize("seed", SEEDS)
def test_the_references_pass_under_every_seed(seed):
    assert check_linear_attention(ac.linear_attention, seed=seed).passed
    assert check_gated_delta_rule(ac.gated_delta_rule, seed=seed).passed


def test_a_missing_value_error_costs_only_its_case():
    report = check_linear_attention(linear.linear_no_value_error)
    failed = [r.name for r in report.results if not r.passed]
    assert failed == ["causal=True with S != T raises ValueError naming `causal`"], failed

    def unnamed(query, key, value, causal=True):
        if causal and key.shape[-2] != query.shape[-2]:
            raise ValueError("S must equal T")
        return ac.linear_attention(query, key, value, causal=causal)

    report = check_linear_attention(unnamed)
    (bad,) = [r for r in report.results if not r.passed]
    assert "should name the argument `causal`" in bad.message


def test_a_value_error_for_more_keys_only_fails_on_fewer_keys():
    """The refusal is tried with S > T and with S < T: a guard on S > T alone (a loop over
    the queries then reads past the keys) fails the case, and the message shows S < T."""
    report = check_linear_attention(linear.linear_raises_only_for_longer_keys)
    (bad,) = [r for r in report.results if not r.passed]
    assert bad.name == "causal=True with S != T raises ValueError naming `causal`"
    assert "k (2, 4, 3)" in bad.message and "returned without raising" in bad.message, bad.message

    def crashes(query, key, value, causal=True):  # the student's: IndexError for S < T
        if causal and key.shape[-2] > query.shape[-2]:
            raise ValueError("causal=True: more keys than queries")
        if causal:
            key[..., query.shape[-2] - 1, :]
        return ac.linear_attention(query, key, value, causal=causal)

    report = check_linear_attention(crashes)
    (bad,) = [r for r in report.results if not r.passed]
    assert "IndexError" in bad.message and "S < T" in bad.message, bad.message


def test_the_default_changed_to_non_causal_is_told_as_the_default():
    report = check_linear_attention(linear.linear_default_not_causal)
    (bad,) = [r for r in report.results if not r.passed]
    assert bad.mistake == "linear-default-not-causal", bad.message
    assert "the default of `causal` must be True" in bad.message
    assert "summed over every key" not in bad.message


def test_a_value_error_for_non_causal_cross_attention_is_told_that_s_may_differ():
    def refuses(query, key, value, causal=True):
        if key.shape[-2] != query.shape[-2]:
            raise ValueError("causal: S must equal T")
        return ac.linear_attention(query, key, value, causal=causal)

    report = check_linear_attention(refuses)
    failed = [r for r in report.results if not r.passed]
    assert [r.name for r in failed] == ["causal=False, T=4 queries, S=7 keys, B=2, H=2, Dk=4, Dv=2"]
    assert "with causal=False the number of keys S may differ" in failed[0].message


def test_beta_on_the_read_back_is_named_and_at_t1_named_with_its_twin():
    """At T=1 from a zero state the read-back is 0: beta on it only and beta ignored give
    the same values, and the message names both rather than guess."""
    report = check_gated_delta_rule(linear.delta_beta_on_read)
    failed = [r for r in report.results if not r.passed]
    assert failed[0].mistake == "delta-beta-on-read-only", failed[0].message
    assert "beta is not used" not in failed[0].message
    (one,) = [r for r in failed if r.name == "T=1: one token"]
    assert "one of several mistakes" in one.message, one.message
    assert "beta multiplies the read-back only" in one.message
    assert "beta is not used" in one.message


def test_an_initial_state_changed_in_place_is_told():
    def in_place(query, key, value, g, beta, initial_state=None):
        out, state = ac.gated_delta_rule(query, key, value, g, beta, initial_state)
        if initial_state is not None:
            initial_state.mul_(0.5)
        return out, state

    report = check_gated_delta_rule(in_place)
    assert not report.passed and "changed its input `initial_state` in place" in str(report)


def test_a_state_updated_in_place_is_told_at_the_gradient():
    def in_place(query, key, value, causal=True):
        phi_q, phi_k = torch.nn.functional.elu(query) + 1, torch.nn.functional.elu(key) + 1
        state = query.new_zeros(*query.shape[:-2], query.shape[-1], value.shape[-1])
        z = query.new_zeros(*query.shape[:-1][:-1], query.shape[-1])
        outs = []
        for i in range(query.shape[-2]):
            state += phi_k[..., i, :, None] * value[..., i, None, :]
            z = z + phi_k[..., i, :]
            num = (phi_q[..., i, :, None] * state).sum(-2)
            outs.append(num / (phi_q[..., i, :] * z).sum(-1, keepdim=True))
        return torch.stack(outs, -2)

    report = check_linear_attention(in_place)
    failed = [r for r in report.results if not r.passed]
    assert any("write `S = S + ...`" in r.message for r in failed), str(report)


@pytest.mark.parametrize("target", ["linear_attention", "gated_delta_rule"])
def test_a_float32_round_trip_fails_and_its_message_leads_with_the_rule(target):
    reference = {"linear_attention": ac.linear_attention, "gated_delta_rule": ac.gated_delta_rule}

    def round_trip(*args, **kwargs):
        dtype = args[0].dtype
        args = [a.float() if isinstance(a, torch.Tensor) else a for a in args]
        kwargs = {k: v.float() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        out = reference[target](*args, **kwargs)
        if isinstance(out, tuple):
            return tuple(o.to(dtype) for o in out)
        return out.to(dtype)

    report = CHECKS[target](round_trip)
    first = next(r for r in report.results if not r.passed)
    assert "\nHint: keep float64: no float32 round trip." in first.message, first.message
    # every float64 case carries the rule; the report shows it once, then "as above"
    hinted = [r for r in report.results if "Hint: keep float64" in r.message]
    assert len(hinted) >= 3, str(report)
    assert str(report).count("no float32 round trip. Your values") == 1, str(report)
    again = "Hint: keep float64: no float32 round trip (as above)."
    assert str(report).count(again) == len(hinted) - 1, str(report)
    assert report._repr_html_().count("no float32 round trip. Your values") == 1


def test_the_statements_say_keep_float64_and_what_is_not_allowed():
    import nbformat

    for folder in (ROOT / "exercises", ROOT / "exercises" / "solutions"):
        nb = nbformat.read(folder / "22_linear_attention.ipynb", 4)
        text = " ".join("\n".join(c.source for c in nb.cells).split())
        assert text.count("Keep float64: no float32 round trip") == 2
        assert text.count("scores 0 a solution cell that calls or imports it") == 2
        assert "Not the package's `linear_attention`" in text
        assert "Not the package's `gated_delta_rule`" in text
        assert "the check never passes `chunk_size`" in text


# ---------------------------------------------------------------- the package is not the answer

CALLS = {
    "linear_attention": (
        "def linear_attention(query, key, value, causal=True):\n"
        "    from attention_course import linear_attention as la\n"
        "    return la(query, key, value, causal=causal)\n"
    ),
    "gated_delta_rule": (
        "def gated_delta_rule(query, key, value, g, beta, initial_state=None):\n"
        "    import attention_course.linear as L\n"
        "    return L.gated_delta_rule(query, key, value, g, beta, initial_state)\n"
    ),
}


@pytest.mark.parametrize("task_name", sorted(CALLS))
def test_a_package_call_fails_the_check_cell_and_the_grader_alike(task_name, monkeypatch):
    import nbformat

    from attention_course.checks import CHECKERS
    from attention_course.checks._policy import breaks_policy, policy_problem, policy_record
    from attention_course.checks._scan import scan_notebook
    from attention_course.grading.grade import _policy

    exercise = "22_linear_attention"
    tasks = json.loads((ROOT / "attention_course" / "exercise_tasks.json").read_text())
    given = json.loads((ROOT / "attention_course" / "exercise_given.json").read_text())
    nb = json.loads((ROOT / "exercises" / "solutions" / f"{exercise}.ipynb").read_text())
    task = next(t for t in tasks[exercise] if t["name"] == task_name)
    cell = next(
        c
        for c in nb["cells"]
        if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == task["solution_cell"]
    )
    cell["source"] = CALLS[task_name]
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    monkeypatch.setattr(sys.modules["__main__"], "In", ["", *cells], raising=False)
    candidate = type("Candidate", (), {"__module__": "__main__"})
    candidate.__name__ = task_name
    checker = CHECKERS[task_name]
    check_says = policy_problem(candidate, checker.target, policy_record(checker)["forbidden"])
    record = {**task, **_policy(task)}
    book = nbformat.reads(json.dumps(nb), 4)
    findings = scan_notebook(book, [record], given[exercise]).get(task["id"], [])
    grader_says = [f.message() for f in findings if breaks_policy(f, record.get("forbidden", []))]
    assert "calls the reference" in check_says and task_name in check_says, check_says
    assert grader_says and any(task_name in m for m in grader_says), grader_says


# ---------------------------------------------------------------- 22.state_or_cache


def test_qwen3_next_cache_outgrows_its_state_after_512_tokens():
    """32 value heads x 128 x 128 = 524,288 numbers of state; 2 x 2 x 256 = 1,024 numbers of
    cache a token: equal at 512 tokens, larger from 513."""
    assert state_or_cache_reference(512, *QWEN3_NEXT) == (1_048_576, 1_048_576, 513)
    assert state_or_cache_reference(32768, *QWEN3_NEXT)[1] == 64 * 1_048_576


def test_the_sizes_are_qwen3_nexts_config():
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3NextConfig()
    assert QWEN3_NEXT == (
        config.linear_num_value_heads,
        config.linear_key_head_dim,
        config.linear_value_head_dim,
        config.num_key_value_heads,
        config.head_dim,
        2,  # bfloat16
    )


def test_the_first_length_is_the_first_where_the_cache_is_larger():
    for config in [c for _, c in STATE_CACHE_CASES] + [_drawn_state_config(s) for s in range(40)]:
        T, H, Dk, Dv, Hkv, Dh, b = config
        _, _, first = state_or_cache_reference(*config)
        per_token, state = 2 * Hkv * Dh, H * Dk * Dv
        assert per_token * first > state >= per_token * (first - 1), config


def test_the_drawn_configurations_follow_the_run_seed_and_keep_the_tie():
    from attention_course.checks._data import drawing_from

    at_zero = [_drawn_state_config(2501), _drawn_state_config(2511)]
    assert at_zero == [_drawn_state_config(2501), _drawn_state_config(2511)]
    others = []
    for run in range(1, 30):
        with drawing_from(run):
            config = _drawn_state_config(2501)
        others.append(config)
        T, H, Dk, Dv, Hkv, Dh, b = config
        # a whole number of tokens' cache: 'larger' and 'at least as large' differ by one
        assert H * Dk * Dv % (2 * Hkv * Dh) == 0, config
    assert len(set(others)) > 20 and at_zero[0] not in others


def _ceil_length(T, H, Dk, Dv, Hkv, Dh, b):
    s, c, _ = state_or_cache_reference(T, H, Dk, Dv, Hkv, Dh, b)
    return s, c, -(-H * Dk * Dv // (2 * Hkv * Dh))


def _keys_only(T, H, Dk, Dv, Hkv, Dh, b):
    return H * Dk * Dv * b, Hkv * Dh * T * b, H * Dk * Dv // (Hkv * Dh) + 1


def _numbers(T, H, Dk, Dv, Hkv, Dh, b):
    return H * Dk * Dv, 2 * Hkv * Dh * T, H * Dk * Dv // (2 * Hkv * Dh) + 1


def _state_per_token(T, H, Dk, Dv, Hkv, Dh, b):
    s, c, f = state_or_cache_reference(T, H, Dk, Dv, Hkv, Dh, b)
    return s * T, c, f


def _bits(T, H, Dk, Dv, Hkv, Dh, b):
    s, c, f = state_or_cache_reference(T, H, Dk, Dv, Hkv, Dh, b)
    return 8 * s, 8 * c, f


def _bf16_fixed(T, H, Dk, Dv, Hkv, Dh, b):
    return state_or_cache_reference(T, H, Dk, Dv, Hkv, Dh, 2)


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (_ceil_length, "larger, strictly"),
        (_keys_only, "a key AND a value"),
        (_numbers, "numbers, not bytes"),
        (_state_per_token, "does not grow with the tokens"),
        (_bits, "bits, not bytes"),
        (_bf16_fixed, "2 bytes a number whatever bytes_per_number says"),
    ],
    ids=["at least as large", "keys only", "numbers", "state per token", "bits", "bf16 fixed"],
)
@pytest.mark.parametrize("seed", [0, 1, 7, 4242])
def test_the_quiz_names_each_mistake_under_every_seed(wrong, phrase, seed):
    report = check_quiz("22.state_or_cache", wrong, seed=seed)
    assert not report.passed
    first = next(r for r in report.results if not r.passed)
    assert phrase in first.message, first.message


def test_the_quiz_takes_numpy_torch_arrays_and_whole_floats_and_refuses_fractions():
    def as_numpy(*config):
        return tuple(np.int64(v) for v in state_or_cache_reference(*config))

    def as_array(*config):
        return np.array(state_or_cache_reference(*config))

    def as_tensor(*config):
        return torch.tensor(state_or_cache_reference(*config))

    def as_floats(*config):  # exercise 21's rule and the Numbers form's: a whole float counts
        return tuple(float(v) for v in state_or_cache_reference(*config))

    def as_float_tensors(*config):
        return tuple(torch.tensor(float(v)) for v in state_or_cache_reference(*config))

    for right in (as_numpy, as_array, as_tensor, as_floats, as_float_tensors):
        assert check_quiz("22.state_or_cache", right, seed=3).passed, right.__name__
    assert check_quiz("22.state_or_cache", state_or_cache_reference, seed=3).passed

    def as_float(T, H, Dk, Dv, Hkv, Dh, b):
        s, c, _ = state_or_cache_reference(T, H, Dk, Dv, Hkv, Dh, b)
        return s, c, H * Dk * Dv / (2 * Hkv * Dh) + 0.5

    report = check_quiz("22.state_or_cache", as_float)
    assert not report.passed and "exact integers" in str(report), str(report)
    assert "a float counts only when it holds the exact integer" in str(report)

    def as_matrix(*config):
        return torch.tensor(state_or_cache_reference(*config)).reshape(3, 1).repeat(1, 2)

    report = check_quiz("22.state_or_cache", as_matrix)
    assert "return all three, `return state_bytes, cache_bytes, first_length`" in str(report)


def test_the_statement_says_which_floats_count():
    import nbformat

    for folder in (ROOT / "exercises", ROOT / "exercises" / "solutions"):
        nb = nbformat.read(folder / "22_linear_attention.ipynb", 4)
        text = " ".join("\n".join(c.source for c in nb.cells).split())
        assert "so does a float that holds the exact integer (`1048576.0`)" in text
        assert "a rounded float such as `1.05e6` fails" in text


# ---------------------------------------------------------------- Hugging Face's recurrence


def test_qwen3_nexts_recurrence_passes_in_float32_and_is_told_the_float64_rule():
    """HF's `torch_recurrent_gated_delta_rule` is the same recurrence computed in float32:
    it passes the float32 case; in the float64 cases the first ✗ leads with "keep float64";
    with `use_qk_l2norm_in_kernel=True` (q and k normalised inside) the mistake is named."""
    pytest.importorskip("transformers")
    from transformers.models.qwen3_next import modeling_qwen3_next as hf

    def qwen(query, key, value, g, beta, initial_state=None, l2norm=False):
        return hf.torch_recurrent_gated_delta_rule(
            query, key, value, g, beta, initial_state, True, use_qk_l2norm_in_kernel=l2norm
        )

    report = check_gated_delta_rule(qwen)
    passed = [r.name for r in report.results if r.passed]
    assert passed == ["float32 inputs give float32 results"], str(report)
    first = next(r for r in report.results if not r.passed)
    assert "\nHint: keep float64: no float32 round trip." in first.message, first.message

    def qwen_l2(query, key, value, g, beta, initial_state=None):
        return qwen(query, key, value, g, beta, initial_state, l2norm=True)

    first = next(r for r in check_gated_delta_rule(qwen_l2).results if not r.passed)
    assert first.mistake == "delta-qk-normalised", first.message
