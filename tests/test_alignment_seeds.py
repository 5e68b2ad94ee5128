"""scripts/alignment_seeds.py, chapter 3's seed comparison, at its --quick size; and the
committed JSON that the chapter reads has the fields the chapter uses."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "book" / "data" / "alignment_seeds.json"
RUNS = ("supervised", "readout_only")


def _check_fields(data: dict) -> None:
    training = data["training"]
    assert data["test_chains"] == 500 and data["test_steps"] > data["test_chains"]
    for name in RUNS:
        runs = data["results"][name]
        assert [run["seed"] for run in runs] == training["seeds"]
        for run in runs:
            assert run["steps"] == training[f"{name}_steps"]
            for key in ("per_step", "whole_sequence", "pointer", "mean_weight_on_right_input"):
                assert 0.0 <= run[key] <= 1.0
            assert run["whole_sequence"] <= run["per_step"]
            watched = run["watched_pointer_loss"]
            assert watched["highest"] >= max(watched["first"], 0.0)
            assert 0 <= watched["highest_at_step"] < run["steps"]
            assert 0 <= run["wrong_steps"] <= data["test_steps"]
            if run["wrong_steps"]:
                assert 0.0 <= run["wrong_shares_a_number"] <= 1.0
                assert 0.0 < run["wrong_shares_a_number_by_chance"] < 1.0


def test_quick_run_writes_the_fields_the_chapter_reads(tmp_path, run_script):
    out = tmp_path / "seeds.json"
    run_script("alignment_seeds.py", "--quick", "--out", str(out))
    data = json.loads(out.read_text())
    _check_fields(data)
    # an untrained-sized run: a wrong input shares a number with the right pair about as
    # often as chance says (the statistic the chapter compares is computed correctly)
    run = data["results"]["readout_only"][0]
    assert abs(run["wrong_shares_a_number"] - run["wrong_shares_a_number_by_chance"]) < 0.05


def test_committed_results_have_the_fields_the_chapter_reads():
    data = json.loads(COMMITTED.read_text())
    assert data["training"]["supervised_steps"] == 300
    assert data["training"]["readout_only_steps"] == 1500
    assert data["training"]["seeds"] == [0, 1]
    _check_fields(data)
