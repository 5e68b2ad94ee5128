"""scripts/moe_study.py (chapter 21's dense-against-MoE study), run at small size, and the
committed results the chapter reads (book/data/moe_study.json)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "book" / "data" / "moe_study.json"
ARMS = {"dense", "moe", "dense_wide", "moe_no_loss", "moe_bias"}
MOE_ARMS = {"moe", "moe_no_loss", "moe_bias"}


def _check_load(stats: dict, E: int) -> None:
    assert set(stats) == {"max_share", "entropy"}
    assert 1 / E - 1e-9 <= stats["max_share"] <= 1 + 1e-9
    assert -1e-9 <= stats["entropy"] <= math.log(E) + 1e-6


def _check(data: dict) -> None:
    """The fields chapter 21 reads, and the facts that hold whatever the numbers are."""
    assert data["command"].startswith("python scripts/moe_study.py")
    assert data["seconds"] > 0 and data["machine"]["threads"] == 1
    D, L = data["config"]["d_model"], data["config"]["num_layers"]
    assert set(data["arms"]) == ARMS
    E = data["arms"]["moe"]["options"]["num_experts"]
    k = data["arms"]["moe"]["options"]["top_k"]
    seeds = data["training"]["seeds"]
    runs = data["runs"]
    assert len(runs) == len(ARMS) * len(seeds)
    assert {(r["arm"], r["seed"]) for r in runs} == {(a, s) for a in ARMS for s in seeds}
    steps, every = data["training"]["steps"], data["training"]["load_every"]
    for run in runs:
        assert 0 < run["val_loss"] < 10 and run["train_seconds"] > 0
        if run["arm"] in MOE_ARMS:
            assert len(run["val_load"]) == L
            for stats in run["val_load"]:
                _check_load(stats, E)
            assert [p["step"] for p in run["load"]] == sorted({*range(1, steps + 1, every), steps})
            for point in run["load"]:
                assert len(point["layers"]) == L
                for stats in point["layers"]:
                    _check_load(stats, E)
            # the balancing loss is at least k (its value at perfect balance), less rounding
            assert run["aux_loss_first"] > k - 0.05 and run["aux_loss_last50"] > k - 0.05
            assert ("router_bias" in run) == (run["arm"] == "moe_bias")
        else:
            assert "load" not in run
    first = {r["arm"]: r for r in runs if r["seed"] == seeds[0]}
    router = L * D * E
    # equal active parameters (the router aside), equal total parameters (the router aside)
    assert first["moe"]["active_parameters"] == first["dense"]["parameters"] + router
    assert first["moe"]["parameters"] == first["dense_wide"]["parameters"] + router
    assert first["moe"]["parameters"] > first["moe"]["active_parameters"]
    assert first["dense"]["active_parameters"] == first["dense"]["parameters"]
    for bias in first["moe_bias"]["router_bias"]:
        assert len(bias) == E
    for name, value in data["paired"].items():
        arm, other = name.split("_minus_")
        diffs = []
        for seed in seeds:
            loss = {r["arm"]: r["val_loss"] for r in runs if r["seed"] == seed}
            diffs.append(loss[arm] - loss[other])
        assert value["values"] == pytest.approx(diffs, abs=1e-4)
        assert value["mean"] == pytest.approx(sum(diffs) / len(diffs), abs=1e-4)
        assert value["n"] == len(seeds)
        assert len(seeds) == 1 or value["ci95"] >= 0
    assert set(data["paired"]) == {
        "moe_minus_dense",
        "moe_minus_dense_wide",
        "moe_no_loss_minus_moe",
        "moe_bias_minus_moe",
    }
    for name in ("dense", "moe", "dense_wide"):
        rates = data["throughput"][name]["tokens_per_second"]
        assert rates == sorted(rates) and all(r > 0 for r in rates)
        assert data["throughput"][name]["median"] in rates


def test_the_quick_study_runs_and_writes_every_field(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    sys.modules.pop("moe_study", None)
    import moe_study

    out = tmp_path / "moe.json"
    moe_study.main(["--quick", "--out", str(out)])
    data = json.loads(out.read_text())
    _check(data)
    assert data["command"].endswith("--quick") and data["training"]["seeds"] == [0]


def test_the_committed_study_has_every_field_and_three_seeds():
    data = json.loads(COMMITTED.read_text())
    _check(data)
    assert data["command"] == "python scripts/moe_study.py"
    assert data["training"]["seeds"] == [0, 1, 2]
