"""scripts/induction_seeds.py (chapter 17's seeds and threads), run for a few steps."""

from __future__ import annotations

import json


def test_short_run_writes_the_fields_the_chapter_reads(tmp_path, run_script):
    out = tmp_path / "seeds.json"
    run_script("induction_seeds.py", "--steps", "20", "--out", str(out))
    result = json.loads(out.read_text())
    runs = result["runs"]
    # the threads each run had (read after seeding: seed_everything alone sets one thread)
    assert [(r["seed"], r["threads"]) for r in runs] == [(0, 1), (1, 1), (2, 1), (0, 2)]
    for r in runs:
        assert len(r["curve"]) == 20 // result["every"] + 1  # steps 0, 10, 20
        assert r["final_loss"] == r["curve"][-1]
        assert abs(r["curve"][0] - 3.47) < 0.1  # untrained: about ln 32
        below = [i * result["every"] for i, v in enumerate(r["curve"]) if v < r["curve"][0] / 2]
        assert r["phase_step"] == (below[0] if below else None)
    assert runs[0]["curve"][0] == runs[3]["curve"][0]  # same seed, same untrained model
