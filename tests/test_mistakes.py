"""The checkers' internals: one mistake table (id -> message), one simulator of attention
variants, and the public checkers' signatures and imports.

- ``checks/_mistakes.py``: ids are well formed, messages unique (the runner reads an id
  back from a message), no message of the table is written out a second time in
  ``checks/``, and a report carries the id of the mistake it names.
- ``_weights.attention_variant`` with no mistake switched on *is* the reference
  ``MultiHeadAttention`` and ``CausalSelfAttention``, and each mistake changes the output.
- ``check_<target>`` shows ``(candidate, *, timeout=10.0, seed=0) -> Report`` to
  ``inspect.signature`` and ``help()``, with the real annotations, and
  ``attention_course.checks`` imports every checker by name.
"""

from __future__ import annotations

import ast
import inspect
import os
import pydoc
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import attention_course as ac
from attention_course import checks
from attention_course.checks import REGISTRY, Report
from attention_course.checks._mistakes import MISTAKES, mistake_id, mistake_in, says
from attention_course.checks._weights import attention_variant

sys.path.insert(0, os.path.dirname(__file__))
from buggy import CATALOGUE, names  # noqa: E402
from buggy.multihead import MHAScalesByDModel  # noqa: E402

CHECKS_DIR = Path(checks.__file__).parent

# ---------------------------------------------------------------- the mistake table


def test_ids_are_well_formed_and_messages_unique():
    for key, text in MISTAKES.items():
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", key), key
        assert text and not text.endswith("."), key  # the report adds the full stop
    assert len(set(MISTAKES.values())) == len(MISTAKES)


def test_a_message_is_read_back_as_its_id():
    assert mistake_id(says("mask-inverted")) == "mask-inverted"
    unscaled = says("dropout-unscaled", entries="entries", scale=1.25)
    assert mistake_id(unscaled) == "dropout-unscaled"
    assert mistake_id("a message of no known mistake") is None
    text = says("heads-split-without-transpose")
    assert mistake_in(f"the result: wrong values\nLikely mistake: {text}.") == (
        "heads-split-without-transpose"
    )
    # the form `_compare.name_from_probe` writes
    assert (
        mistake_in(f"wrong\nLikely mistake (the same code on causal_mask(6)): {text}.")
        == "heads-split-without-transpose"
    )
    assert mistake_in(f"wrong\nHint: {text}.") is None  # a hint names no mistake


def _string_constants(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def test_no_message_of_the_table_is_written_twice():
    """A checker names a mistake of the table with ``says(id)``, never with a copy of its
    words (which would drift apart from the table's)."""
    messages = {text for text in MISTAKES.values() if "{" not in text}
    for path in sorted(CHECKS_DIR.glob("*.py")):
        if path.name == "_mistakes.py":
            continue
        copies = messages & _string_constants(path)
        assert not copies, f"{path.name} repeats the table's words: {sorted(copies)}"


def test_one_wording_for_the_head_split_mistake():
    """Before the table, the same mistake read "heads reshaped without the transpose" in
    one checker and "heads split without a transpose" in another."""
    sources = "\n".join(p.read_text() for p in CHECKS_DIR.glob("*.py"))
    assert "heads reshaped without" not in sources
    assert "without a transpose" not in sources


def test_the_report_carries_the_mistake_id():
    report = checks.check_multi_head_attention(MHAScalesByDModel)
    assert "scale-by-d-model" in report.mistakes
    failed = [r for r in report.results if r.mistake == "scale-by-d-model"]
    assert failed and all(not r.passed for r in failed)
    assert all(says("scale-by-d-model") in r.message for r in failed)
    data = report.to_dict()["results"]
    assert {r["mistake"] for r in data} >= {"scale-by-d-model"}
    assert all(r["mistake"] is None for r in data if r["passed"])


def test_catalogue_ids_are_in_the_table():
    """A catalogue entry that pins an id pins one of the table's (a misspelt id would be
    read as prose and fail, see `buggy.names`)."""
    pinned = [e for _, _, _, e in CATALOGUE if e in MISTAKES]
    assert len(pinned) >= 40
    assert names(Report("check_x"), None)


# ---------------------------------------------------------------- one simulator


def _inputs(B=2, T=5, S=7, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, L, D, generator=g, dtype=torch.float64) for L in (T, S, S))


def test_the_simulator_without_a_mistake_is_multi_head_attention():
    torch.manual_seed(0)
    module = ac.MultiHeadAttention(8, 2).double().eval()
    q, k, v = _inputs()
    mask = torch.rand(2, 1, 5, 7, generator=torch.Generator().manual_seed(1)) > 0.3
    with torch.no_grad():
        expected = module(q, k, v, mask=mask)
        got = attention_variant(module, q, k, v, mask)
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1], expected[1])


def test_the_simulator_without_a_mistake_is_causal_self_attention():
    torch.manual_seed(0)
    module = ac.CausalSelfAttention(12, 3, bias=True).double().eval()
    (x,) = _inputs(T=6, D=12)[:1]
    keep = torch.ones(6, 6, dtype=torch.bool).tril()
    with torch.no_grad():
        expected = module(x)
        got, _ = attention_variant(module, x, x, x, keep)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize(
    "mistake",
    [
        {"split": "no-transpose"},
        {"split": "interleaved"},
        {"merge": "no-transpose"},
        {"merge": "interleaved"},
        {"scale": "d_model"},
        {"scale": "none"},
        {"out_proj": False},
        {"bias": False},
        {"values": "w_k"},
        {"dim": -2},
        {"invert": True},
        {"after": True},
    ],
    ids=lambda m: "-".join(f"{k}={v}" for k, v in m.items()),
)
def test_each_simulated_mistake_changes_the_output(mistake):
    torch.manual_seed(0)
    module = ac.CausalSelfAttention(8, 2, bias=True).double().eval()
    (x,) = _inputs(T=5)[:1]
    keep = torch.ones(5, 5, dtype=torch.bool).tril()
    with torch.no_grad():
        right, _ = attention_variant(module, x, x, x, keep)
        wrong, _ = attention_variant(module, x, x, x, keep, **mistake)
    assert not torch.allclose(right, wrong, atol=1e-6)


# ---------------------------------------------------------------- the checkers' signatures


@pytest.mark.parametrize("entry", REGISTRY, ids=[c.target for c in REGISTRY])
def test_a_checker_shows_its_real_signature_and_docstring(entry):
    check = entry.check
    signature = inspect.signature(check)
    params = signature.parameters
    assert list(params) == ["candidate", "timeout", "seed"]
    assert params["candidate"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert params["timeout"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["timeout"].default == 10.0 and params["seed"].default == 0
    assert params["timeout"].annotation is float and params["seed"].annotation is int
    assert params["candidate"].annotation in (type, Callable)
    assert signature.return_annotation is Report
    summary = inspect.cleandoc(check.cases.__doc__).splitlines()[0]
    assert check.__doc__.startswith(summary)
    assert "Returns:" in check.__doc__ and "timeout:" in check.__doc__
    text = pydoc.render_doc(check, renderer=pydoc.plaintext)
    assert f"{check.__name__}(candidate: " in text
    assert summary in text


def test_a_checker_returns_what_its_signature_says():
    report = checks.check_soft_argmax(ac.soft_argmax, timeout=30.0, seed=3)
    assert isinstance(report, Report) and report.passed
    assert isinstance(checks.check_soft_argmax.cases(ac.soft_argmax), list)


def test_the_package_imports_every_checker_by_name():
    """``attention_course.checks`` names its checkers in import statements (no
    ``globals().update``), so that readers, linters and IDEs find them."""
    tree = ast.parse((CHECKS_DIR / "__init__.py").read_text())
    calls = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert "globals" not in calls
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    registered = {c.check.__name__ for c in REGISTRY}
    assert registered <= imported
    assert {n for n in checks.__all__ if n.startswith("check_")} == registered
    for entry in REGISTRY:
        assert getattr(checks, entry.check.__name__) is entry.check
