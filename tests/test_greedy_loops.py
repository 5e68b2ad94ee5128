"""scripts/greedy_loops.py (chapter 13's survey of greedy decoding from common prompts)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from greedy_loops import loop_period, loop_start, sentence_starters  # noqa: E402


def test_loop_period_finds_the_shortest_repeat_of_the_tail():
    assert loop_period("abc" + " " * 100) == 1
    assert loop_period("The start. " + "-3.14, " * 20) == 7
    assert (
        loop_period("no loop here at all, " * 2 + "".join(chr(65 + i % 26) for i in range(100)))
        == 26
    )
    assert loop_period("".join(chr(33 + (i * i) % 90) for i in range(200))) is None
    assert loop_period(" " * 50) is None  # shorter than the tail it reads


def test_loop_start_is_where_the_periodic_tail_begins():
    text = "A list: 1, 2.\n" + "-3.14, " * 20  # ", 2, " would join the loop: it ends in ", "
    assert text[loop_start(text, 7) :] == text[text.index("-3.14") :]
    assert loop_start("xyz" + " " * 100, 1) == 3


def test_sentence_starters_counts_words_after_a_full_stop():
    text = "One. The a. The b. If c. The d. If e. A f."
    assert sentence_starters(text, 2) == ["The", "If"]


def test_small_run_writes_the_greedy_texts(tmp_path, run_script):
    out = tmp_path / "loops.json"
    run_script("greedy_loops.py", "--prompts", "2", "--tokens", "30", "--out", str(out))
    result = json.loads(out.read_text())
    rows = result["results"]
    assert [row["prompt"] for row in rows] == ["The ", "If "]
    assert all(len(row["text"]) == len(row["prompt"]) + 30 for row in rows)
    assert all(row["text"].startswith(row["prompt"]) for row in rows)
    assert all(row["loop_period"] == loop_period(row["text"]) for row in rows)
