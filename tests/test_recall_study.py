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
ARMS = {"softmax", "linear", "gated_delta"}


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
    # softmax and linear: the same parameters; gated delta: + one Linear(D, 2H) with bias
    assert params["softmax"] == params["linear"]
    assert params["gated_delta"] - params["softmax"] == data["config"]["num_layers"] * 2 * H * (
        D + 1
    )
    acc = {(r["arm"], r["pairs"], r["seed"]): r["accuracy"] for r in runs}
    assert {(p["arm"], p["minus"]) for p in data["paired"]} == {
        ("gated_delta", "linear"),
        ("softmax", "gated_delta"),
    }
    assert len(data["paired"]) == 2 * len(grid)
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


def test_the_committed_study_has_every_field_and_three_seeds():
    data = json.loads(COMMITTED.read_text())
    _check(data)
    assert data["command"] == "python scripts/recall_study.py"
    assert data["training"]["seeds"] == [0, 1, 2]


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
    assert names["gated_delta"] - names["softmax"] == {
        "blocks.0.1.w_gate.weight",
        "blocks.0.1.w_gate.bias",
    }
    # one forward of each: (B, T, values) logits
    batch = recall_study.recall_batch(2, 3, task, torch.Generator().manual_seed(1))
    for model in models.values():
        assert model(*batch[:3]).shape == (2, 5, 4)
