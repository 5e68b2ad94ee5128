"""benchmarks/softcap.py (chapter 20's cost of soft-capping): not a timing test. The
modules it times compute the same attention up to the cap, its three calls take the paths
they claim, and its report is well formed."""

from __future__ import annotations

import torch


def test_the_timed_modules_share_weights_and_differ_only_by_the_cap():
    from benchmarks.softcap import modules

    m = modules(d_model=16, num_heads=2, cap=50.0)
    assert m["plain"].softcap is None and m["capped"].softcap == 50.0
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        plain, capped = m["plain"](x), m["capped"](x)
    # small scores: the cap is nearly the identity, so the outputs agree closely ...
    torch.testing.assert_close(capped, plain, atol=1e-4, rtol=1e-4)
    # ... and with a tiny cap they do not (the cap is applied)
    tight = modules(d_model=16, num_heads=2, cap=1e-3)["capped"]
    with torch.no_grad():
        assert (tight(x) - plain).abs().max() > 1e-3


def _saved_score_matrices(call, T):
    """The T x T tensors a call saves for the backward pass (chapter 20's count)."""
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        call()
    return [s for s in shapes if len(s) >= 3 and s[-2:] == (T, T)]


def test_the_explicit_arm_is_the_uncapped_module_off_the_fused_path():
    """The ``explicit`` arm computes the fused arm's output, but materialises the scores:
    it saves T x T tensors for the backward pass, as the capped arm does (one more there:
    the cap's own), and the fused arm saves none."""
    from benchmarks.softcap import modules

    m = modules(d_model=16, num_heads=2, cap=50.0)
    x = torch.randn(2, 7, 16, requires_grad=True)
    explicit, _ = m["plain"](x, need_weights=True)
    torch.testing.assert_close(explicit, m["plain"](x), atol=1e-5, rtol=1e-5)
    fused = _saved_score_matrices(lambda: m["plain"](x), 7)
    uncapped = _saved_score_matrices(lambda: m["plain"](x, need_weights=True), 7)
    capped = _saved_score_matrices(lambda: m["capped"](x), 7)
    assert len(fused) == 0 < len(uncapped) < len(capped)


def test_the_report_has_medians_and_an_interval_around_each_ratio():
    from benchmarks.softcap import compare

    r = compare(B=1, T=8, d_model=16, num_heads=2, repeats=3)
    assert set(r["median_seconds"]) == {"fused", "explicit", "softcap"}
    assert all(v > 0 for v in r["median_seconds"].values())
    for key in ("softcap_over_fused", "explicit_over_fused", "softcap_over_explicit"):
        ratio = r[key]
        assert 0 < ratio["low"] <= ratio["ratio"] <= ratio["high"]
    assert r["config"]["repeats"] == 3 and r["config"]["cap"] == 50.0
