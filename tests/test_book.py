"""The book's structure: every chapter is in the table of contents, every
notebook records the python3 kernel, and committed notebooks carry outputs."""

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb")) + sorted((ROOT / "exercises").rglob("*.ipynb"))


def _toc_entries() -> set[str]:
    entries = set()
    for line in (ROOT / "_toc.yml").read_text(encoding="utf-8").splitlines():
        line = line.strip().removeprefix("- ").strip()
        for key in ("root:", "file:"):
            if line.startswith(key):
                entries.add(line[len(key) :].strip())
    return entries


def test_every_chapter_is_in_the_table_of_contents_and_exists():
    toc = _toc_entries()
    chapters = {f"book/{p.stem}" for p in (ROOT / "book").glob("*.ipynb")}
    pages = {f"book/{p.stem}" for p in (ROOT / "book").glob("*.md")}
    assert chapters - toc == set(), "notebooks missing from _toc.yml"
    assert pages - toc == set(), "pages missing from _toc.yml"
    missing = {e for e in toc if not any((ROOT / e).parent.glob(Path(e).name + ".*"))}
    assert missing == set(), "_toc.yml lists files that do not exist"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_notebook_metadata_and_outputs(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    assert code, "a notebook without code"
    executed = [c for c in code if c.get("execution_count") is not None]
    assert len(executed) == len(code), "commit notebooks executed, with their outputs"


@pytest.mark.parametrize("path", sorted((ROOT / "book").glob("*.ipynb")), ids=lambda p: p.name)
def test_chapter_has_a_single_title(path):
    nb = nbformat.read(path, as_version=4)
    titles = [
        line
        for c in nb.cells
        if c.cell_type == "markdown"
        for line in c.source.splitlines()
        if line.startswith("# ")
    ]
    assert len(titles) == 1, f"expected one '# ' title, got {titles}"


# --- Committed outputs carry no warnings -------------------------------------------------

# A Python warning category as `warnings.formatwarning` prints it (``auto.py:21: TqdmWarning:
# ...``), or `warnings.warn`, anywhere in a stream, a displayed text or a traceback; in a
# stderr stream, also the bare word "warning" (logging's ``WARNING:``, a library's own note).
_WARNING = re.compile(r"\b[A-Z]\w*Warning\b|\bwarnings\.warn\b")


def _output_texts(output) -> list[tuple[str, str]]:
    """(where, text) for every text an output stores: a stream, a text/* item, a traceback."""
    kind = output["output_type"]
    if kind == "stream":
        return [(output["name"], output["text"])]
    if kind == "error":
        return [("traceback", "\n".join(output["traceback"]))]
    data = output.get("data", {})
    return [(mime, data[mime]) for mime in data if mime.startswith("text/")]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_outputs_carry_no_warnings(path):
    """A warning in a committed output is noise a reader cannot act on, and it differs
    between machines. Fix its cause (or silence it in the code, with a reason), then
    re-execute the notebook."""
    nb = nbformat.read(path, as_version=4)
    found = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            for where, text in _output_texts(output):
                text = "".join(text) if isinstance(text, list) else text
                hit = _WARNING.search(text)
                if hit is None and where == "stderr":
                    hit = re.search(r"(?i)\bwarning\b", text)
                if hit is not None:
                    line = text[text.rfind("\n", 0, hit.start()) + 1 :].split("\n", 1)[0]
                    found.append(f"cell {index} ({where}): {line.strip()[:160]}")
    assert found == [], "committed outputs hold warnings:\n" + "\n".join(found)
