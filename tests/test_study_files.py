"""The committed JSON files of the study scripts use scripts/_study.py's one naming: the
run's metadata in ``machine``, one name for one quantity in every file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = [
    "attention_course/assets/kv_heads15.json",
    "attention_course/assets/position_study.json",
    "book/data/alignment_seeds.json",
    "book/data/greedy_loops.json",
    "book/data/induction_seeds.json",
    "book/data/kv_cache_generation.json",
    "book/data/latent_study.json",
    "book/data/logit_growth_study.json",
    "book/data/modern_block.json",
    "book/data/rope_scaling.json",
    "book/data/moe_study.json",
    "book/data/sinks_study.json",
    "book/data/recall_study.json",
]
METADATA = {"torch", "python", "threads", "processor", "schedule"}
# old names of quantities that have one name now (scripts/_study.py's docstring)
RENAMED = {
    "final_train_loss": "train_loss_last50 or train_loss_last_step",
    "total_seconds": "seconds",
}


def _keys(value, path=""):
    """Every (path, key) of the dicts inside ``value``."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield path, key
            yield from _keys(item, f"{path}/{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _keys(item, f"{path}/{i}")


@pytest.mark.parametrize("name", FILES)
def test_a_study_file_keeps_metadata_in_machine_and_uses_one_name_per_quantity(name):
    data = json.loads((ROOT / name).read_text())
    assert not METADATA & set(data), f"{name}: metadata outside 'machine'"
    assert set(data.get("machine", {})) <= METADATA
    for path, key in _keys(data):
        assert key not in RENAMED, f"{name}{path}: {key!r} is now {RENAMED[key]}"
        if key == "seconds":  # a whole study's, rerun's or addition's time; one run's is
            # train_seconds (an addition: variants run later with the same protocol)
            assert re.fullmatch(r"|/reruns/0|/additions/\d+", path), (
                f"{name}{path}: one run's time is train_seconds"
            )


def test_every_study_script_writes_one_of_these_files():
    written = set()
    for script in (ROOT / "scripts").glob("*.py"):
        for line in script.read_text().splitlines():
            if line.startswith("DEFAULT_OUT = _study.ROOT / "):
                parts = re.findall(r'"([^"]+)"', line)
                written.add("/".join(parts))
    assert written == set(FILES)
