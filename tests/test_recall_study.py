"""scripts/recall_study.py (chapter 22's associative-recall study), run at small size, and the
committed results the chapter reads (book/data/recall_study.json)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "book" / "data" / "recall_study.json"
ARMS = {"softmax", "linear", "delta", "gated_delta"}
PAIRS = {("delta", "linear"), ("gated_delta", "delta"), ("gated_delta", "linear")}


def _study_module(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    sys.modules.pop("recall_study", None)
    import recall_study

    return recall_study


def _check(data: dict) -> None:
    """The fields chapter 22 reads, and the facts that hold whatever the numbers are."""
    assert data["command"].startswith("python scripts/recall_study.py")
    assert data["seconds"] > 0 and data["machine"]["threads"] == 1
    seeds, grid = data["training"]["seeds"], data["task"]["pairs"]
    runs = data["runs"]
    assert {(r["arm"], r["pairs"], r["seed"]) for r in runs} == {
        (a, n, s) for a in ARMS for n in grid for s in seeds
    }
    assert len(runs) == len(ARMS) * len(grid) * len(seeds)
    D, H = data["config"]["d_model"], data["config"]["num_heads"]
    assert data["state_size"] == {
        "Dk": D // H, "Dv": D // H, "heads": H, "layers": data["config"]["num_layers"]
    }  # fmt: skip
    assert data["chance"] == pytest.approx(1 / data["task"]["num_values"], abs=1e-4)
    for run in runs:
        assert 0 <= run["accuracy"] <= 1 and run["train_seconds"] > 0
        assert math.isfinite(run["train_loss_last50"])
    params = {r["arm"]: r["parameters"] for r in runs}
    # softmax and linear: the same parameters; the delta arms: + one Linear(D, H) for beta
    # (with bias), the gated arm + one more output per head for g
    L = data["config"]["num_layers"]
    assert params["softmax"] == params["linear"]
    assert params["delta"] - params["softmax"] == L * H * (D + 1)
    assert params["gated_delta"] - params["softmax"] == L * 2 * H * (D + 1)
    # every run counted; "learnt" is the rule the docstring fixes
    for run in runs:
        assert run["learnt"] == (
            run["train_loss_last50"] < math.log(data["task"]["num_values"]) - 0.05
        )
        assert run["lr"] == data["chosen_lr"][run["arm"]]
        if run["arm"] in ("delta", "gated_delta"):
            assert [g["layer"] for g in run["gates"]] == list(range(L))
            for g in run["gates"]:
                for name in ("beta", "decay"):
                    s = g[name]
                    assert 0 <= s["q10"] <= s["q50"] <= s["q90"] <= 1 and 0 <= s["mean"] <= 1
                if run["arm"] == "delta":  # no decay: a = 1 exactly
                    assert g["decay"] == {"mean": 1.0, "q10": 1.0, "q50": 1.0, "q90": 1.0}
        else:
            assert "gates" not in run
    # the learning rate: every arm at every lr of the grid on the selection seed, not reported
    selection = data["selection"]
    assert data["training"]["selection_seed"] not in seeds
    assert {(r["arm"], r["lr"], r["pairs"]) for r in selection} == {
        (a, lr, n) for a in ARMS for lr in data["training"]["lr_grid"] for n in grid
    }
    assert all(r["seed"] == data["training"]["selection_seed"] for r in selection)
    for arm in ARMS:
        mean = {}
        for r in selection:
            if r["arm"] == arm:
                mean.setdefault(r["lr"], []).append(r["accuracy"])
        best = max(sum(v) / len(v) for v in mean.values())
        chosen = data["chosen_lr"][arm]
        assert sum(mean[chosen]) / len(mean[chosen]) == pytest.approx(best, abs=1e-3)
    acc = {(r["arm"], r["pairs"], r["seed"]): r["accuracy"] for r in runs}
    assert {(p["arm"], p["minus"]) for p in data["paired"]} == PAIRS
    assert len(data["paired"]) == len(PAIRS) * len(grid)
    for p in data["paired"]:
        diffs = [acc[p["arm"], p["pairs"], s] - acc[p["minus"], p["pairs"], s] for s in seeds]
        assert p["differences"] == pytest.approx(diffs, abs=2e-4)
        assert p["mean"] == pytest.approx(sum(diffs) / len(diffs), abs=2e-4)
        assert p["ci95"][0] <= p["mean"] + 1e-4 and p["mean"] - 1e-4 <= p["ci95"][1]


def test_the_quick_study_runs_and_writes_every_field(tmp_path, monkeypatch):
    recall_study = _study_module(monkeypatch)
    out = tmp_path / "recall.json"
    recall_study.main(["--quick", "--out", str(out)])
    data = json.loads(out.read_text())
    _check(data)
    assert data["command"].endswith("--quick") and data["training"]["seeds"] == [0, 1]


def test_the_committed_study_has_every_field_and_four_seeds():
    data = json.loads(COMMITTED.read_text())
    _check(data)
    assert data["command"] == "python scripts/recall_study.py --workers 2"
    assert data["training"]["seeds"] == [0, 1, 2, 3]
    assert data["training"]["lr_grid"] == [1e-3, 3e-3, 1e-2]


def test_recall_batches_store_distinct_keys_and_ask_for_stored_values(monkeypatch):
    recall_study = _study_module(monkeypatch)
    task = {"num_keys": 20, "num_values": 5, "queries": 6, "pairs": [7]}
    keys, values, is_query, targets = recall_study.recall_batch(
        3, 7, task, torch.Generator().manual_seed(0)
    )
    assert keys.shape == values.shape == is_query.shape == (3, 13) and targets.shape == (3, 6)
    assert is_query[:, 7:].all() and not is_query[:, :7].any()
    for b in range(3):
        stored = dict(zip(keys[b, :7].tolist(), values[b, :7].tolist()))
        assert len(stored) == 7  # distinct keys
        asked = keys[b, 7:].tolist()
        assert [stored[k] for k in asked] == targets[b].tolist()
        assert (values[b, 7:] == -1).all()


def test_the_arms_differ_only_in_the_token_mixer(monkeypatch):
    recall_study = _study_module(monkeypatch)
    config = {"d_model": 8, "num_heads": 2, "num_layers": 1, "d_ff": 16}
    task = {"num_keys": 10, "num_values": 4, "queries": 2, "pairs": [3]}
    models = {a: recall_study.RecallModel(a, config, task, 4) for a in sorted(ARMS)}
    names = {a: set(m.state_dict()) for a, m in models.items()}
    assert names["softmax"] == names["linear"]
    gate = {"blocks.0.1.w_gate.weight", "blocks.0.1.w_gate.bias"}
    assert names["delta"] - names["softmax"] == gate
    assert names["gated_delta"] == names["delta"]
    assert models["delta"].blocks[0][1].w_gate.out_features == 2  # beta per head
    assert models["gated_delta"].blocks[0][1].w_gate.out_features == 4  # beta and g per head
    # the gated arm starts near the delta rule: a = exp(-softplus(-7)) per token
    bias = models["gated_delta"].blocks[0][1].w_gate.bias
    assert bias[:2].tolist() == [0.0, 0.0] and bias[2:].tolist() == [-7.0, -7.0]
    # one forward of each: (B, T, values) logits
    batch = recall_study.recall_batch(2, 3, task, torch.Generator().manual_seed(1))
    for model in models.values():
        assert model(*batch[:3]).shape == (2, 5, 4)


def test_the_delta_arm_is_the_gated_arm_with_no_decay(monkeypatch):
    """The delta arm calls the rule with g = 0 (a = 1, no decay) and a learnt beta in (0, 1)."""
    recall_study = _study_module(monkeypatch)
    config = {"d_model": 8, "num_heads": 2, "num_layers": 1, "d_ff": 16}
    task = {"num_keys": 10, "num_values": 4, "queries": 2, "pairs": [3]}
    torch.manual_seed(0)
    delta = recall_study.RecallModel("delta", config, task, 4)
    mixer = delta.blocks[0][1]
    mixer.record = True
    batch = recall_study.recall_batch(2, 3, task, torch.Generator().manual_seed(1))
    delta(*batch[:3])
    beta, g = mixer.gates
    assert g.shape == beta.shape == (2, 5, 2) and (g == 0).all()
    assert ((beta > 0) & (beta < 1)).all()


def test_the_learning_rate_rule_takes_the_best_mean_and_the_smaller_on_a_tie(monkeypatch):
    recall_study = _study_module(monkeypatch)
    rows = [
        {"arm": "a", "lr": 1e-3, "accuracy": 0.5},
        {"arm": "a", "lr": 1e-3, "accuracy": 0.7},  # mean 0.6
        {"arm": "a", "lr": 1e-2, "accuracy": 0.9},
        {"arm": "a", "lr": 1e-2, "accuracy": 0.2},  # mean 0.55
        {"arm": "b", "lr": 3e-3, "accuracy": 0.4},
        {"arm": "b", "lr": 1e-3, "accuracy": 0.4},  # a tie: the smaller lr
    ]
    assert recall_study.select_lr(rows, arms=("a", "b")) == {"a": 1e-3, "b": 1e-3}


def _check_extension(data: dict) -> None:
    """The post hoc extension: delta arms only, the same rule on the union of the rates, an
    arm retrained on every reported seed only where its choice moved."""
    assert [a["name"] for a in data["additions"]] == ["delta_lr_extension"]
    ext = data["additions"][0]
    assert ext["post_hoc"] is True and ext["arms"] == ["delta", "gated_delta"]
    assert ext["command"].startswith("python scripts/recall_study.py")
    assert "--extend-lr" in ext["command"] and ext["seconds"] > 0
    old_grid, grid = data["training"]["lr_grid"], data["task"]["pairs"]
    assert not set(ext["lr_grid_added"]) & set(old_grid)
    assert ext["lr_grid"] == sorted(old_grid + ext["lr_grid_added"])
    assert {(r["arm"], r["lr"], r["pairs"]) for r in ext["selection"]} == {
        (a, lr, n) for a in ext["arms"] for lr in ext["lr_grid_added"] for n in grid
    }
    assert all(r["seed"] == data["training"]["selection_seed"] for r in ext["selection"])
    for arm in ext["arms"]:  # the pre-registered rule on the union of the rates
        mean = {}
        for r in data["selection"] + ext["selection"]:
            if r["arm"] == arm:
                mean.setdefault(r["lr"], []).append(r["accuracy"])
        best = max(sum(v) / len(v) for v in mean.values())
        chosen = ext["chosen_lr"][arm]
        assert sum(mean[chosen]) / len(mean[chosen]) == pytest.approx(best, abs=1e-3)
    assert ext["moved"] == [a for a in ext["arms"] if ext["chosen_lr"][a] != data["chosen_lr"][a]]
    done = ext["seeds_done"]
    assert set(done) <= set(data["training"]["seeds"])
    assert {(r["arm"], r["pairs"], r["seed"]) for r in ext["runs"]} >= {
        (a, n, s) for a in ext["moved"] for n in grid for s in done
    }
    assert all(r["lr"] == ext["chosen_lr"][r["arm"]] for r in ext["runs"])
    if not (ext["moved"] and done):
        assert ext["paired"] == []
        return
    acc = {(r["arm"], r["pairs"], r["seed"]): r["accuracy"] for r in data["runs"]}
    acc.update({(r["arm"], r["pairs"], r["seed"]): r["accuracy"] for r in ext["runs"]})
    assert len(ext["paired"]) == len(PAIRS) * len(grid)
    for p in ext["paired"]:
        diffs = [acc[p["arm"], p["pairs"], s] - acc[p["minus"], p["pairs"], s] for s in done]
        assert p["differences"] == pytest.approx(diffs, abs=2e-4)


def test_the_quick_extension_keeps_the_registered_run_and_adds_its_own_section(
    tmp_path, monkeypatch
):
    recall_study = _study_module(monkeypatch)
    out = tmp_path / "recall.json"
    recall_study.main(["--quick", "--out", str(out)])
    before = json.loads(out.read_text())
    recall_study.main(["--quick", "--out", str(out), "--extend-lr", "0.03", "0.1"])
    data = json.loads(out.read_text())
    assert {k: v for k, v in data.items() if k != "additions"} == before
    _check(data)
    _check_extension(data)
    assert data["additions"][0]["lr_grid_added"] == [0.03, 0.1]
    assert data["additions"][0]["command"].endswith("--quick --extend-lr 0.03 0.1")


def test_the_committed_extension_tried_3e_2_for_the_delta_arms_only():
    data = json.loads(COMMITTED.read_text())
    _check_extension(data)
    ext = data["additions"][0]
    assert ext["command"] == "python scripts/recall_study.py --extend-lr 0.03 --workers 2"
    assert ext["lr_grid_added"] == [0.03]
