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


# ---------------------------------------------------------------- the student's findings (s6)


def test_the_naive_mla_form_passes_and_the_statement_says_it_is_not_detected():
    """The checker grades `output` and `q_absorbed` only; the naive form (per-head keys and
    values built from the latent) gives the same two tensors and passes. The statement must
    say so rather than promise an enforcement the checker does not have."""
    import json
    from pathlib import Path

    assert check_mla_absorbed_attention(latent.mla_naive_form).passed
    root = Path(__file__).resolve().parents[1]
    for path in (
        "exercises/18_latent_attention.ipynb",
        "exercises/solutions/18_latent_attention.ipynb",
    ):
        nb = json.loads((root / path).read_text())
        text = " ".join(
            " ".join("".join(c["source"]).split())
            for c in nb["cells"]
            if c["cell_type"] == "markdown"
        )
        assert "`output` and `q_absorbed`, and nothing else" in text, path
        assert "it is not detected" in text, path


@pytest.mark.parametrize("run_seed", [0, 1, 2, 3, 12345])
def test_kv_cache_bytes_int32_fails_under_every_run_seed(run_seed):
    """Two fixed cases (the same under every run seed) exceed 2^31 and 2^32 bytes: a count in
    int32 fails in the check cell (run seed 0) as in the grader, the overflow named."""
    from attention_course.checks.latent import _LARGE_CONFIGS

    report = check_kv_cache_bytes(latent.kv_cache_bytes_int32, seed=run_seed)
    assert not report.passed
    assert "cache-integer-overflow" in report.mistakes, str(report)
    large = [r for r in report.results if "more than 2^3" in r.name]
    assert len(large) == 2 and not any(r.passed for r in large)
    sizes = [
        expected_cache_bytes(_LARGE_CONFIGS["mha"], 3000, 1),
        expected_cache_bytes(_LARGE_CONFIGS["mla"], 32768, 2),
    ]
    assert 2**31 < sizes[0] < 2**32 < sizes[1], sizes


def test_kv_cache_bytes_in_bits_names_bits_first_and_the_heads_only_beside():
    """×8 can equal H / Hkv: the MHA case names the bits alone, and where the GQA case's
    number is also the heads' mistake, both are named (the bits not first)."""
    report = check_kv_cache_bytes(latent.kv_cache_bytes_bits)
    first = next(r for r in report.results if not r.passed)
    assert first.mistake == "cache-counted-in-bits", first.message
    for r in report.results:
        if "grouped or multi-query" in r.message:
            assert "Or (the same number here): the count is in bits" in r.message


@pytest.mark.parametrize("run_seed", [0, 7])
def test_yarn_high_clipped_at_half_fails_under_every_run_seed(run_seed):
    report = check_rope_frequencies(
        long_context.rope_frequencies_high_clipped_at_half, seed=run_seed
    )
    (failed,) = [r for r in report.results if not r.passed]
    assert "original length 65536" in failed.name
    assert failed.mistake == "yarn-high-clipped-at-half", failed.message
    import math

    d, length = 64, 65536
    i_slow = d * math.log(length / (2 * math.pi)) / (2 * math.log(10000.0))
    assert math.ceil(i_slow) > d // 2 - 1


def test_no_float32_hint_beside_an_entry_off_by_more_than_one_percent():
    """The unclamped ramp doubles some frequencies: its message must not call the values
    "close to the reference" (it names the clamp instead), and a value wrong by far in one
    small entry gets no precision hint."""
    from attention_course.checks._compare import _float32_precision_hint

    report = check_rope_frequencies(long_context.rope_frequencies_ramp_not_clamped)
    assert "yarn-ramp-not-clamped" in report.mistakes
    assert "close to the reference" not in str(report)
    expected = torch.tensor([1.0, 1e-3, 1e-4], dtype=torch.float64)
    got = expected.clone()
    got[2] = 5e-4  # a relative 4e-4 of the largest entry, five times the entry itself
    assert _float32_precision_hint(expected)(got) is None
    assert _float32_precision_hint(expected)(expected * (1 + 3e-8)) is not None


def test_streaming_coinciding_off_by_ones_are_not_named_where_they_coincide():
    """With more sinks than the window, one sink too many and a window one too wide can be
    the same mask: that case names neither; the first case names each one rightly."""
    for impl, mistake in (
        (long_context.streaming_mask_sinks_one_too_many, "streaming-sinks-one-too-many"),
        (long_context.streaming_mask_window_too_wide, "streaming-window-one-wide"),
    ):
        report = check_streaming_mask(impl)
        named = {r.mistake for r in report.results if not r.passed} - {None}
        assert named == {mistake}, str(report)


# ---------------------------------------------------------------- one policy, stated


def _statements(exercise: str) -> dict[str, str]:
    """Each check task's statement (the markdown cell before its solution cell)."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    nb = json.loads((root / "exercises" / f"{exercise}.ipynb").read_text())
    out, last = {}, ""
    for c in nb["cells"]:
        if c["cell_type"] == "markdown":
            last = " ".join("".join(c["source"]).split())
        nbgrader = c.get("metadata", {}).get("nbgrader", {})
        if c["cell_type"] == "code" and nbgrader.get("solution"):
            out[nbgrader["grade_id"]] = last
    return out


STATED = {
    "18_latent_attention": {
        "mla_absorbed_attention": ["`MultiHeadLatentAttention`"],
        "kv_cache_bytes": ["`cache_per_token`"],
    },
    "19_longer_than_trained": {
        "rope_frequencies": ["`rope_frequencies`", "`apply_rope`"],
        "scaled_rope_scores": ["`apply_rope` (with or without `scaling=`)", "`rope_frequencies`"],
        "streaming_mask": ["`streaming_mask`", "`causal_mask`", "`sliding_window_mask`"],
        "sink_attention": ["`sink_attention`"],
    },
}


@pytest.mark.parametrize("exercise", sorted(STATED))
def test_every_check_task_states_what_is_allowed_and_names_the_package(exercise):
    statements = _statements(exercise)
    for task, names in STATED[exercise].items():
        text = statements[task]
        assert "**Allowed:**" in text, (task, text)
        assert "the grader scores 0 a solution cell that calls or imports it" in text, task
        for name in names:
            assert name in text, (task, name)


REFERENCE_CALLS = {
    ("19_longer_than_trained", "scaled_rope_scores"): (
        "def scaled_rope_scores(query, key, scaling, base=10000.0):\n"
        "    from attention_course import apply_rope\n"
        "    T, S = query.shape[-2], key.shape[-2]\n"
        "    q = apply_rope(query, torch.arange(S - T, S), base=base, scaling=scaling)\n"
        "    k = apply_rope(key, torch.arange(S), base=base, scaling=scaling)\n"
        "    return q @ k.transpose(-1, -2) / query.shape[-1] ** 0.5\n",
        "attention_course.apply_rope",
    ),
    ("19_longer_than_trained", "rope_frequencies"): (
        "def rope_frequencies(head_dim, base=10000.0, scaling=None):\n"
        "    from attention_course.relative_positions import rope_frequencies as rf\n"
        "    return rf(head_dim, base, scaling)\n",
        "rope_frequencies",
    ),
    ("19_longer_than_trained", "streaming_mask"): (
        "def streaming_mask(size, window, num_sink, device=None):\n"
        "    import attention_course as ac\n"
        "    return ac.streaming_mask(size, window, num_sink, device)\n",
        "attention_course.streaming_mask",
    ),
    ("19_longer_than_trained", "sink_attention"): (
        "def sink_attention(query, key, value, sinks, mask=None, scale=None):\n"
        "    from attention_course import sink_attention as sa\n"
        "    return sa(query, key, value, sinks, mask=mask, scale=scale)\n",
        "sink_attention",
    ),
    ("18_latent_attention", "mla_absorbed_attention"): (
        "def mla_absorbed_attention(q, latent, k_rope, w_ukv, d_v):\n"
        "    import attention_course as ac\n"
        "    B, H, T, D = q.shape\n"
        "    S, r = latent.shape[1:]\n"
        "    dr = k_rope.shape[-1]\n"
        "    dn = D - dr\n"
        "    W = w_ukv.view(H, dn + d_v, r)\n"
        "    qa = torch.einsum('bhtn,hnr->bhtr', q[..., :dn], W[:, :dn])\n"
        "    qr = apply_rope(q[..., dn:], torch.arange(S - T, S))\n"
        "    keys = latent[:, None].expand(B, H, S, r)\n"
        "    qq = torch.cat([qa, qr], -1) * (r + dr) ** 0.5 / D ** 0.5\n"
        "    kk = torch.cat([keys, k_rope[:, None].expand(B, H, S, dr)], -1)\n"
        "    keep = torch.ones(T, S, dtype=torch.bool).tril(S - T)\n"
        "    mixed, _ = ac.scaled_dot_product_attention(qq, kk, keys, mask=keep)\n"
        "    return torch.einsum('bhtr,hvr->bhtv', mixed, W[:, dn:]), qa\n",
        "attention_course.scaled_dot_product_attention",
    ),
    ("18_latent_attention", "kv_cache_bytes"): (
        "def kv_cache_bytes(config, tokens, batch=1):\n"
        "    from attention_course import cache_per_token\n"
        "    per = cache_per_token(kv_rank=config['kv_rank'], d_rope=config['d_rope'])\n"
        "    return per * config['num_layers'] * tokens * batch * config['bytes_per_number']\n",
        "cache_per_token",
    ),
}


@pytest.mark.parametrize("exercise, task_name", sorted(REFERENCE_CALLS))
def test_a_package_call_fails_the_check_cell_and_the_grader_alike(exercise, task_name, monkeypatch):
    """The student ran `check_scaled_rope_scores` on a solution built on the package's
    `apply_rope(..., scaling=)` outside a notebook (no cells to scan: ✓) while the grader
    scored 0. In the notebook, the check cell scans the cells the kernel ran and says what
    the grader says, for every task of 18-19."""
    pytest.importorskip("nbformat")
    import json
    from pathlib import Path

    import nbformat

    from attention_course.checks import CHECKERS
    from attention_course.checks._policy import breaks_policy, policy_problem, policy_record
    from attention_course.checks._scan import scan_notebook
    from attention_course.grading.grade import _policy

    root = Path(__file__).resolve().parents[1]
    tasks = json.loads((root / "attention_course" / "exercise_tasks.json").read_text())
    given = json.loads((root / "attention_course" / "exercise_given.json").read_text())
    nb = json.loads((root / "exercises" / "solutions" / f"{exercise}.ipynb").read_text())
    task = next(t for t in tasks[exercise] if t["name"] == task_name)
    source, named = REFERENCE_CALLS[(exercise, task_name)]
    cell = next(
        c
        for c in nb["cells"]
        if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == task["solution_cell"]
    )
    cell["source"] = source
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
    assert "calls the reference" in check_says and named in check_says, check_says
    assert grader_says and any(named in m for m in grader_says), grader_says
