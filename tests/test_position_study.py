"""scripts/position_study.py (chapter 14's length-extrapolation study), run at small size,
and the committed results the chapter loads."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from attention_course import GPT

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "attention_course" / "assets"
POSITIONS = ["learned", "sinusoidal", "rope", "alibi", "none"]


def _check_results(data: dict) -> None:
    """The fields chapter 14 reads."""
    L = data["config"]["L"]
    assert data["lengths"] == [L, 2 * L, 4 * L]
    assert data["positions"] == POSITIONS
    for pos in POSITIONS:
        runs = data["results"][pos]
        assert [r["seed"] for r in runs] == data["config"]["seeds"]
        for r in runs:
            assert set(r["loss_at"]) == {str(n) for n in data["lengths"]}
            assert len(r["curve"]) == 4 * L
            assert all(0 < v < 20 for v in r["curve"])
            # the mean over the first L positions of the 4L windows is the loss at L
            # only on different windows; but both are finite, positive losses
            assert all(0 < v < 20 for v in r["loss_at"].values())
            assert 0 < r["train_loss_last_step"] < 20 and r["train_seconds"] > 0


def _check_weights(path: Path, vocab_size: int) -> None:
    saved = torch.load(path, weights_only=True)
    assert saved["config"]["vocab_size"] == vocab_size
    assert set(saved["state_dicts"]) == set(POSITIONS)
    for pos, state in saved["state_dicts"].items():
        model = GPT(**saved["config"], pos=pos)
        model.load_state_dict({k: v.float() for k, v in state.items()})


def test_quick_study_writes_what_the_chapter_reads(tmp_path, run_script):
    out = tmp_path / "study.json"
    run_script("position_study.py", "--no-progress", "--quick", "--out", str(out))
    data = json.loads(out.read_text())
    assert data["config"]["steps"] == 3
    _check_results(data)
    _check_weights(out.with_suffix(".pt"), data["vocab_size"])

    # --only retrains one setting and leaves the other settings' entries as they were
    before = json.loads(out.read_text())
    before_weights = torch.load(out.with_suffix(".pt"), weights_only=True)["state_dicts"]
    before["results"]["rope"][0]["loss_at"]["16"] = 99.0  # a marker the rerun must replace
    out.write_text(json.dumps(before, indent=1) + "\n")
    args = ("--quick", "--only", "rope", "--reason", "test", "--out", str(out))
    run_script("position_study.py", "--no-progress", *args)
    after = json.loads(out.read_text())
    _check_results(after)
    assert after["results"]["rope"][0]["loss_at"]["16"] < 20
    assert after["reruns"][0]["pos"] == "rope" and after["reruns"][0]["reason"] == "test"
    assert after["reruns"][0]["replaced"][0]["loss_at"]["16"] == 99.0
    assert after["seconds"] == before["seconds"]  # the whole study's time, not the rerun's
    for pos in POSITIONS:
        if pos != "rope":
            assert after["results"][pos] == before["results"][pos]
    after_weights = torch.load(out.with_suffix(".pt"), weights_only=True)["state_dicts"]
    assert list(after_weights) == POSITIONS
    for pos in POSITIONS:
        for name, w in before_weights[pos].items():
            assert torch.equal(after_weights[pos][name], w)  # rope too: same seed, same model
    _check_weights(out.with_suffix(".pt"), after["vocab_size"])


def test_committed_study_results():
    path = ASSETS / "position_study.json"
    data = json.loads(path.read_text())
    _check_results(data)
    assert data["config"]["L"] == 64 and len(data["config"]["seeds"]) >= 2
    _check_weights(path.with_suffix(".pt"), data["vocab_size"])
    assert path.with_suffix(".pt").stat().st_size < 2_000_000
    # the sinusoidal seeds were retrained (--only) after GPT(pos="sinusoidal") took
    # Vaswani et al.'s scaled token embeddings
    assert [r["pos"] for r in data.get("reruns", [])] == ["sinusoidal"]
