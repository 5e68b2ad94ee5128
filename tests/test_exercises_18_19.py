"""Exercises 18 and 19: the checkers' expected values are the package's (and Hugging Face's
where the package is compared with it), every catalogued mistake in tests/buggy is named,
answers given as numpy or torch numbers are accepted, and the inputs follow the run seed.

- ``checks.latent.naive_mla`` (the expected values of ``mla_absorbed_attention``) is
  ``MultiHeadLatentAttention``'s attention step: fed the module's own queries, latent and
  rotary key, it gives the module's output (with a cache, ``q_rank`` None and set,
  ``d_v != d_nope``).
- ``checks.latent.expected_cache_bytes`` is ``cache_per_token`` times layers, tokens, batch.
- The mistakes' simulators in ``checks.long_context`` with no mistake switched on are the
  package's ``rope_frequencies``, ``streaming_mask`` and ``sink_attention``.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

import attention_course as ac
from attention_course.checks import (
    check_kv_cache_bytes,
    check_mla_absorbed_attention,
    check_multi_head_latent_attention,
    check_rope_frequencies,
    check_scaled_rope_scores,
    check_sink_attention,
    check_streaming_mask,
)
from attention_course.checks.latent import draw_config, expected_cache_bytes, naive_mla
from attention_course.checks.long_context import _sink_variant, frequencies

sys.path.insert(0, os.path.dirname(__file__))
from buggy import latent, long_context  # noqa: E402

CHECKS = {
    "mla_absorbed_attention": check_mla_absorbed_attention,
    "kv_cache_bytes": check_kv_cache_bytes,
    "multi_head_latent_attention": check_multi_head_latent_attention,
    "rope_frequencies": check_rope_frequencies,
    "scaled_rope_scores": check_scaled_rope_scores,
    "streaming_mask": check_streaming_mask,
    "sink_attention": check_sink_attention,
}
BUGGY = [*latent.CATALOGUE, *long_context.CATALOGUE]
SOLUTIONS = {
    "mla_absorbed_attention": latent.reference_mla_absorbed_attention,
    "kv_cache_bytes": latent.reference_kv_cache_bytes,
    "multi_head_latent_attention": latent.MLAStudent,
    "rope_frequencies": long_context.reference_rope_frequencies,
    "scaled_rope_scores": long_context.reference_scaled_rope_scores,
    "streaming_mask": long_context.reference_streaming_mask,
    "sink_attention": long_context.reference_sink_attention,
}


# ---------------------------------------------------------------- the expected values


@pytest.mark.parametrize(
    "q_rank, d_nope, d_rope, d_v, prefix",
    [(None, 4, 2, 4, 3), (6, 4, 4, 6, 5), (None, 6, 2, 3, 0)],
)
def test_naive_mla_is_the_modules_attention_step(q_rank, d_nope, d_rope, d_v, prefix):
    """The module after ``prefix`` cached tokens, fed 3 more: its output is ``w_o`` of the
    checker's expected heads, computed from the module's own q, latent and rotated k_rope."""
    torch.manual_seed(0)
    H, D, r, T = 2, 12, 5, 3
    module = ac.MultiHeadLatentAttention(
        D, H, r, q_rank=q_rank, d_nope=d_nope, d_rope=d_rope, d_v=d_v
    ).double()
    x = torch.randn(2, prefix + T, D, dtype=torch.float64)
    cache = module.new_cache()
    with torch.no_grad():
        if prefix:
            module(x[:, :prefix], cache=cache)
        got = module(x[:, prefix:], cache=cache, absorbed=True)
        new = x[:, prefix:]
        q = module.w_q(new) if q_rank is None else module.w_uq(module.q_norm(module.w_dq(new)))
        q = q.view(2, T, H, d_nope + d_rope).transpose(1, 2)  # not rotated
        a, k_rope = module.w_dkv(x).split([r, d_rope], dim=-1)
        latent_all = module.kv_norm(a)
        k_rope = ac.apply_rope(k_rope, torch.arange(prefix + T))  # as the cache stores it
        heads, q_absorbed = naive_mla(q, latent_all, k_rope, module.w_ukv.weight, d_v)
        want = module.w_o(heads.transpose(1, 2).reshape(2, T, H * d_v))
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(cache.latent, latent_all, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(cache.k_rope, k_rope, atol=1e-12, rtol=1e-12)
    w_uk = module.w_ukv.weight.view(H, d_nope + d_v, r)[:, :d_nope]
    torch.testing.assert_close(q_absorbed, q[..., :d_nope] @ w_uk[None])


@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize("kind", ["mha", "gqa", "mqa", "mla"])
def test_expected_cache_bytes_is_cache_per_token_times_the_rest(kind, seed):
    from attention_course.checks._data import drawing_from

    with drawing_from(seed):
        config = draw_config(kind, 3)
    H = config["num_heads"]
    if kind == "mla":
        per_token = ac.cache_per_token(kv_rank=config["kv_rank"], d_rope=config["d_rope"])
    else:
        heads = {"mha": H, "gqa": config.get("num_kv_heads"), "mqa": 1}[kind]
        per_token = ac.cache_per_token(num_kv_heads=heads, d_head=config["head_dim"])
    want = per_token * config["num_layers"] * 100 * 3 * config["bytes_per_number"]
    assert expected_cache_bytes(config, 100, 3) == want


def test_the_drawn_configurations_follow_the_run_seed():
    from attention_course.checks._data import drawing_from

    drawn = []
    for seed in (0, 1, 2, 3):
        with drawing_from(seed):
            drawn.append(tuple(sorted(draw_config("mla", 4).items())))
    assert len(set(drawn)) > 1
    with drawing_from(0):
        assert draw_config("mla", 4) == draw_config("mla", 4)


SCALINGS = [
    None,
    {"type": "linear", "factor": 4.0},
    {"type": "ntk", "factor": 8.0},
    {"type": "yarn", "factor": 4.0, "original_max_len": 4096},
    {"type": "yarn", "factor": 8.0, "original_max_len": 2048},
    {"type": "yarn", "factor": 2.0, "original_max_len": 1024, "beta_fast": 16.0, "beta_slow": 2.0},
    {"type": "yarn", "factor": 1.25, "original_max_len": 64},
]


@pytest.mark.parametrize("scaling", SCALINGS, ids=str)
@pytest.mark.parametrize("head_dim, base", [(32, 10000.0), (64, 500000.0), (128, 10000.0)])
def test_the_frequency_simulator_is_the_packages(scaling, head_dim, base):
    want, factor = ac.rope_frequencies(head_dim, base, scaling)
    got, got_factor = frequencies(head_dim, base, scaling)
    torch.testing.assert_close(got, want.to(torch.float64), atol=0, rtol=2e-7)
    assert got_factor == pytest.approx(factor, rel=1e-12)
    # the solved twin's function too
    mine, my_factor = long_context.reference_rope_frequencies(head_dim, base, scaling)
    torch.testing.assert_close(mine, want.to(torch.float64), atol=0, rtol=2e-7)
    assert my_factor == pytest.approx(factor, rel=1e-12)


def test_each_frequency_mistake_changes_a_yarn_case():
    """Every YaRN mistake the checker names gives other frequencies than the right ones on
    at least one case of the checker (else the mistake would pass)."""
    cases = [(128, 10000.0, s) for s in SCALINGS[3:]] + [(64, 500000.0, SCALINGS[4])]
    for variant in ("ramp_reversed", "no_round", "round_swapped", "interpolate_all"):
        assert any(
            not torch.allclose(frequencies(d, b, s)[0], frequencies(d, b, s, variant)[0])
            for d, b, s in cases
        ), variant


@pytest.mark.parametrize("size, window, num_sink", [(8, 3, 2), (5, 9, 1), (6, 3, 0), (7, 2, 4)])
def test_streaming_reference_is_the_packages(size, window, num_sink):
    want = ac.streaming_mask(size, window, num_sink)
    assert torch.equal(long_context.reference_streaming_mask(size, window, num_sink), want)


def test_the_sink_simulator_is_the_packages():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 4, generator=g, dtype=torch.float64) for n in (4, 6, 6))
    sinks = torch.randn(3, generator=g, dtype=torch.float64)
    mask = torch.rand(4, 6, generator=g) > 0.3
    mask[1] = False  # a fully masked row
    for m in (None, mask, torch.randn(4, 6, generator=g, dtype=torch.float64)):
        out, weights = _sink_variant(q, k, v, sinks, m, None, None)
        want = ac.sink_attention(q, k, v, sinks, mask=m)
        torch.testing.assert_close(out, want[0])
        torch.testing.assert_close(weights, want[1])


# ---------------------------------------------------------------- the checkers


@pytest.mark.parametrize("target", sorted(CHECKS))
def test_the_solved_twins_functions_pass(target):
    report = CHECKS[target](SOLUTIONS[target])
    assert report.passed, str(report)


@pytest.mark.parametrize("target", sorted(CHECKS))
def test_the_reference_passes_under_another_run_seed(target):
    from buggy import REFERENCES

    report = CHECKS[target](REFERENCES[target], seed=12345)
    assert report.passed, str(report)


@pytest.mark.parametrize(
    "target, name, impl, named", BUGGY, ids=[f"{t}-{n}" for t, n, _, _ in BUGGY]
)
def test_each_buggy_version_is_rejected_and_named(target, name, impl, named):
    report = CHECKS[target](impl)
    assert not report.passed, name
    if named in ac.checks._mistakes.MISTAKES:
        assert named in report.mistakes, str(report)
    else:
        assert named in str(report), str(report)


def test_numbers_from_numpy_are_accepted():
    assert check_kv_cache_bytes(latent.kv_cache_bytes_numpy).passed
    assert check_rope_frequencies(long_context.rope_frequencies_float32_hf_style).passed
    assert check_rope_frequencies(long_context.rope_frequencies_numpy_factor).passed

    def as_float(config, tokens, batch=1):
        return float(latent.reference_kv_cache_bytes(config, tokens, batch))

    def as_tensor(config, tokens, batch=1):
        return torch.tensor(latent.reference_kv_cache_bytes(config, tokens, batch))

    assert check_kv_cache_bytes(as_float).passed
    assert check_kv_cache_bytes(as_tensor).passed

    def factor_as_tensor(head_dim, base=10000.0, scaling=None):
        inv, factor = long_context.reference_rope_frequencies(head_dim, base, scaling)
        return inv.float(), torch.tensor(factor)

    assert check_rope_frequencies(factor_as_tensor).passed


def test_the_attention_factor_applied_once_fails_every_scaled_case():
    """The task makes the mistake observable: every case whose factor is not 1 fails."""
    report = check_scaled_rope_scores(long_context.scaled_rope_scores_factor_once)
    for result in report.results:
        scaled = "yarn" in result.name
        assert result.passed != scaled, (result.name, result.message)


def test_kv_cache_bytes_without_the_batch_argument_is_told_so():
    def no_batch(config, tokens):
        return latent.reference_kv_cache_bytes(config, tokens)

    report = check_kv_cache_bytes(no_batch)
    assert not report.passed
    batch_cases = [r for r in report.results if "batch" in r.name]
    assert batch_cases and not any(r.passed for r in batch_cases)
    assert all(r.passed for r in report.results if "batch" not in r.name)


def test_the_mla_check_rejects_the_naive_form_without_q_absorbed():
    def naive_only(q, latent_, k_rope, w_ukv, d_v):
        return naive_mla(q, latent_, k_rope, w_ukv, d_v)[0]

    report = check_mla_absorbed_attention(naive_only)
    assert not report.passed and "q_absorbed" in str(report)


def test_sink_attention_with_detached_sinks_is_told_about_the_gradient():
    report = check_sink_attention(long_context.sink_attention_detached)
    (grad,) = [r for r in report.results if "gradient" in r.name]
    assert not grad.passed and "sinks" in grad.message
    assert all(r.passed for r in report.results if r is not grad)


def test_numpy_integer_and_bool_configs_are_plain_python():
    """The checker hands the student a plain dict of Python ints (no numpy types)."""
    seen = []

    def spy(config, tokens, batch=1):
        seen.append(config)
        return latent.reference_kv_cache_bytes(config, tokens, batch)

    assert check_kv_cache_bytes(spy).passed
    for config in seen:
        assert all(type(v) in (int, str) for v in config.values()), config
    assert not isinstance(np.int64(1), int)  # so the check above means something
