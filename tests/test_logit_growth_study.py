"""scripts/logit_growth_study.py (chapter 20's learning-rate ladder with and without QK-norm
and soft-capping), run at small size, and the committed results the chapter reads
(book/data/logit_growth_study.json)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "book" / "data" / "logit_growth_study.json"
VARIANTS = ("baseline", "qk_norm", "softcap")


def _check(data: dict) -> None:
    """The fields chapter 20 reads, and the facts that hold whatever the numbers are."""
    config = data["config"]
    assert data["command"].startswith("python scripts/logit_growth_study.py")
    assert data["seconds"] > 0 and data["machine"]["threads"] == 1
    seeds, lrs = config["seeds"], config["lrs"]
    runs = data["runs"]
    plain = [r for r in runs if r["z_loss"] == 0]
    z_runs = [r for r in runs if r["z_loss"] > 0]
    # every (learning rate, variant, seed) once; z-loss: the baseline at the top rate, per seed
    assert sorted((r["lr"], r["variant"], r["seed"]) for r in plain) == sorted(
        (lr, v, s) for lr in lrs for v in VARIANTS for s in seeds
    )
    assert sorted(r["seed"] for r in z_runs) == sorted(seeds)
    assert all(r["lr"] == max(lrs) and r["variant"] == "baseline" for r in z_runs)
    assert all(r["z_loss"] == config["z_loss"] for r in z_runs)
    T = config["context"]
    for r in runs:
        assert r["train_seconds"] > 0
        if r["diverged_at"] is None:
            assert 0 < r["val_loss"] < 20
            assert [p["step"] for p in r["probes"]] == config["checkpoints"]
            assert len(r["train_curve"]) == math.ceil(config["steps"] / config["curve_every"])
        else:
            assert r["val_loss"] is None
        for p in r["probes"]:
            assert len(p["max_logit"]) == len(p["entropy"]) == config["num_layers"]
            # a softmax row over at most T keys: entropy between 0 and log T
            assert all(-1e-6 <= e <= math.log(T) + 1e-6 for e in p["entropy"])
        # QK-norm bounds the logit: |q·k|/√Dh <= √Dh · max|g_q| · max|g_k| (here at step 0,
        # where the gains are 1)
        if r["variant"] == "qk_norm":
            dh = config["d_model"] // config["num_heads"]
            assert all(abs(v) <= math.sqrt(dh) + 1e-4 for v in r["probes"][0]["max_logit"])
    # the same initial weights: every variant but QK-norm starts with the same logits
    for r in plain:
        if r["variant"] == "softcap":
            twin = next(b for b in plain if b["variant"] == "baseline" and b["seed"] == r["seed"])
            assert r["probes"][0]["max_logit"] == twin["probes"][0]["max_logit"]
    summary = data["summary"]
    assert set(summary) == {f"{lr:g}" for lr in lrs}
    for lr in lrs:
        row = summary[f"{lr:g}"]
        by = {(r["variant"], r["seed"]): r["val_loss"] for r in plain if r["lr"] == lr}
        for v in ("qk_norm", "softcap"):
            diff = row[f"{v}_minus_baseline"]
            if diff is None:
                continue
            assert diff["n"] == len(seeds)
            mean = sum(by[(v, s)] - by[("baseline", s)] for s in seeds) / len(seeds)
            assert diff["mean"] == pytest.approx(mean, abs=1e-4)
            assert (diff["ci95"] is None) == (len(seeds) == 1)


def test_quick_study_writes_what_the_chapter_reads(tmp_path, run_script):
    out = tmp_path / "logits.json"
    run_script("logit_growth_study.py", "--quick", "--out", str(out))
    data = json.loads(out.read_text())
    assert data["config"]["steps"] == 4
    _check(data)


def test_committed_results():
    if not COMMITTED.exists():
        pytest.fail(f"{COMMITTED.relative_to(ROOT)} is missing: run scripts/logit_growth_study.py")
    data = json.loads(COMMITTED.read_text())
    _check(data)
    assert data["config"]["steps"] == 400 and len(data["config"]["seeds"]) >= 2
