"""Drop stored progress-bar redraws from executed notebooks (run after executing one).

A tqdm bar in a notebook sends every redraw as an output of its own, and the built
site prints each one as a line. ``fit`` clears its bar when it ends (``leave=False``),
so a live notebook shows nothing of it afterwards; this makes the stored notebook
show the same. It removes every stderr stream output that is only carriage-return
redraws or white space, and leaves every other output as it is::

    python scripts/strip_progress.py book/03_additive_attention.ipynb [...]

``tests/test_book.py`` fails on a notebook that still stores such redraws.
"""

from __future__ import annotations

import sys

import nbformat


def is_progress_redraw(output: dict) -> bool:
    """A stderr stream output that is only tqdm redraws ("\\r...") or white space."""
    if output.get("output_type") != "stream" or output.get("name") != "stderr":
        return False
    text = output.get("text", "")
    return text.strip() == "" or (text.startswith("\r") and "\n" not in text)


def strip(path: str) -> int:
    """Remove the redraws from the notebook at ``path``; return how many went."""
    nb = nbformat.read(path, as_version=4)
    removed = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kept = [o for o in cell.outputs if not is_progress_redraw(o)]
        removed += len(cell.outputs) - len(kept)
        cell.outputs = kept
    if removed:
        nbformat.write(nb, path)
    return removed


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(f"{path}: {strip(path)} progress-bar outputs removed")
