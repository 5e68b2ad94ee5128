"""Verdicts and numbers that must not depend on the machine (issue 24, section 2).

- Exercise 17 and its checkers read chapter 17's model from a shipped file
  (``attention_course/assets/induction17.pt``), never from a training run at check time;
  retraining it here from the seed gives the same heads.
- The answers the checkers derive from that model have margins far above float rounding,
  so another CPU or BLAS cannot flip them.
- Every nbval marker in every notebook is one that nbval recognises.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
ASSET = ROOT / "attention_course" / "assets" / "induction17.pt"
NOTEBOOKS = sorted(
    [*ROOT.glob("book/*.ipynb"), *ROOT.glob("exercises/*.ipynb")]
    + [*ROOT.glob("exercises/solutions/*.ipynb")]
)


# ---------------------------------------------------------------- chapter 17's shipped model


def _scores(model, period: int, n: int = 32) -> torch.Tensor:
    """(L, H) induction scores on the checker's evaluation ids."""
    from attention_course.data import repeated_tokens
    from attention_course.interpret import induction_scores

    ids = repeated_tokens(n, period, 32, torch.Generator().manual_seed(1234))
    with torch.no_grad():
        _, weights = model(ids, return_attention=True)
    return torch.stack([induction_scores(w, period) for w in weights])


def test_induction_asset_is_small_float32_and_loads_as_the_config():
    from attention_course.interpret import INDUCTION_CONFIG, load_induction_model

    assert ASSET.stat().st_size < 200_000  # float32 weights of 37,248 parameters
    data = torch.load(ASSET, map_location="cpu", weights_only=True)
    assert data["config"] == INDUCTION_CONFIG
    assert all(v.dtype == torch.float32 for v in data["state_dict"].values())
    assert data["info"]["seed"] == 0 and data["info"]["num_steps"] == 300
    model = load_induction_model()
    assert not model.training and sum(p.numel() for p in model.parameters()) == 37248
    with torch.no_grad():  # a fresh copy each time: changing one leaves the next untouched
        model.blocks[1].attn.w_o.weight.zero_()
    assert load_induction_model().blocks[1].attn.w_o.weight.abs().sum() > 0


def test_checkers_and_exercise_never_train():
    """No checker builds an optimiser or calls a trainer; exercise 17 loads the shipped
    model (its two copies) instead of training one."""
    sources = [*ROOT.glob("attention_course/checks/*.py"), ROOT / "attention_course" / "quiz.py"]
    for path in sources:
        tree = ast.parse(path.read_text())
        names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        names |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert "optim" not in names, path.name
        assert not {n for n in names if n.startswith("train_")}, path.name
    for name in ("17_induction_heads.ipynb", "solutions/17_induction_heads.ipynb"):
        cells = json.loads((ROOT / "exercises" / name).read_text())["cells"]
        source = "".join("".join(c["source"]) for c in cells)
        assert "load_induction_model()" in source and "train_induction_model" not in source


@pytest.mark.parametrize("period", [10, 12, 16, 20])
def test_the_checkers_answers_have_margins_far_above_rounding(period):
    """On the shipped model, the checker's answers are the same on any machine: the best
    head leads every head outside the 0.01 tie window by more than 1e-3, no score sits
    within 1e-3 of that window's edge, and the lowest score is unique by more than 1e-6
    (float32 rounding of these weights is about 1e-7)."""
    from attention_course.checks.interpret import _TIE
    from attention_course.interpret import load_induction_model

    scores = _scores(load_induction_model(), period).flatten()
    edge = scores.max() - _TIE
    assert (scores - edge).abs().min() > 1e-3, scores
    ordered = scores.sort().values
    assert ordered[1] - ordered[0] > 1e-6, ordered


def test_retraining_from_the_seed_gives_the_shipped_heads():
    """scripts/train_induction.py's run, repeated here with one thread (about 15 to 35 s).

    Where torch and its CPU kernels are those that made the file (torch 2.13.0+cpu, AVX512,
    the course's machine), the rebuild is bit-identical. Elsewhere the last digits differ
    and 300 steps amplify them: measured here with two threads instead of one, scores
    moved by up to 0.043 and, for period 10, the best head moved between the two that
    tie within 0.015 ((1, 0) and (1, 2)). So elsewhere the test asks for what the chapter
    claims, within a stated tolerance: every induction score within 0.1 of the shipped
    model's, the best head in layer 1 (0-based) and among the shipped model's heads within
    0.05 of its best, and every layer-1 head scoring above 0.3. The checkers never depend
    on any of this: they read the file."""
    from attention_course.interpret import load_induction_model, train_induction_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rebuilt = train_induction_model(seed=0, num_steps=300)
    finally:
        torch.set_num_threads(threads)
    shipped = load_induction_model()
    same_kernels = (
        shipped.info["torch"] == str(torch.__version__)
        and shipped.info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    )
    if same_kernels:
        for key, value in shipped.state_dict().items():
            assert torch.equal(rebuilt.state_dict()[key], value), key
    for period in (10, 12, 16, 20):
        a, b = _scores(rebuilt, period), _scores(shipped, period)
        assert (a - b).abs().max() < 0.1, (period, a, b)
        best = divmod(int(a.argmax()), 4)
        assert best[0] == 1 and b[best] > b.max() - 0.05, (period, a, b)
        assert bool((a[1] > 0.3).all()), (period, a)


# ---------------------------------------------------------------- nbval markers


def _comment_lines(source: str):
    for number, line in enumerate(source.splitlines()):
        stripped = line.strip()
        if stripped.startswith("#"):
            yield number, stripped


def test_every_nbval_marker_is_one_nbval_recognises():
    """nbval reads a comment as a marker only when, stripped of '#' and spaces, it is
    exactly one of its markers (nbval.plugin.find_comment_markers): a marker followed by
    an explanation is silently ignored and the cell is compared. The course also wants
    the marker on the cell's first line, alone."""
    from nbval.plugin import comment_markers, metadata_tags

    problems = []
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text())["cells"]
        for index, cell in enumerate(cells):
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            for number, comment in _comment_lines(source):
                text = comment.lstrip("#").strip()
                looks = any(m.lower() in text.lower() for m in comment_markers) or (
                    "nbval" in text.lower()
                )
                if not looks:
                    continue
                where = f"{path.relative_to(ROOT)} cell {index} line {number}: {comment!r}"
                if text not in comment_markers:
                    problems.append(f"{where} is not a marker nbval recognises")
                elif number != 0 or comment != f"# {text}":
                    problems.append(f"{where} should be the cell's first line, exactly")
            for tag in cell.get("metadata", {}).get("tags", []):
                if ("nbval" in tag or "raises" in tag) and tag not in metadata_tags:
                    problems.append(f"{path.relative_to(ROOT)} cell {index}: tag {tag!r}")
    assert not problems, "\n".join(problems)


def test_the_marker_test_catches_a_marker_with_extra_text():
    from nbval.plugin import find_comment_markers

    assert list(find_comment_markers("# NBVAL_IGNORE_OUTPUT\nprint(1)"))
    assert not list(find_comment_markers("# NBVAL_IGNORE_OUTPUT (a timing)\nprint(1)"))
