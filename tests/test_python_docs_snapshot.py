"""The course's text is one snapshot shipped with the package, the same on every Python
(issue 24): ``python_docs()`` no longer reads the running Python's ``pydoc_data``, whose
topics differ between releases (vocabulary 103 on 3.11, 104 on 3.10, 3.12 and 3.13)."""

from __future__ import annotations

import hashlib
import json
import lzma
import subprocess
import sys
from pathlib import Path

import pytest

from attention_course.data import python_docs
from attention_course.data.text import SNAPSHOT, SNAPSHOT_PYTHON, SNAPSHOT_SHA256

ROOT = Path(__file__).resolve().parents[1]
TEXT_PY = ROOT / "attention_course" / "data" / "text.py"
OTHER_PYTHONS = [
    Path(f"/root/.pyenv/versions/{version}/bin/python")
    for version in ("3.10.13", "3.12.1", "3.13.0")
]

# Read the snapshot with text.py alone (no attention_course package, so no torch), and
# report what it gives and whether torch got imported.
READER = """
import hashlib, importlib.util, json, sys
spec = importlib.util.spec_from_file_location("course_text", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
text = module.python_docs()
print(json.dumps({
    "python": sys.version.split()[0],
    "length": len(text),
    "vocab": "".join(sorted(set(text))),
    "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
    "torch imported": "torch" in sys.modules,
}))
"""


def test_snapshot_hash_size_and_vocabulary():
    text = python_docs()
    assert hashlib.sha256(text.encode("utf-8")).hexdigest() == SNAPSHOT_SHA256
    assert len(text) == 465_048 and len(set(text)) == 103
    assert SNAPSHOT.stat().st_size < 150_000  # xz-compressed: about 95 kB
    assert lzma.decompress(SNAPSHOT.read_bytes()).decode("utf-8") == text


def test_snapshot_is_in_the_package_data():
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[tool.setuptools.package-data]")[1].split("\n[tool.")[0]
    assert '"assets/*.xz"' in section


def test_snapshot_matches_chapter_13s_checkpoint_vocabulary():
    """The shipped checkpoint was trained on this text: its tokenizer's characters are the
    snapshot's (a different text would give ids outside its vocabulary)."""
    from attention_course import load_gpt_checkpoint

    vocab = load_gpt_checkpoint().vocab
    assert "".join(sorted(set(python_docs()))) == "".join(vocab)


@pytest.mark.skipif(
    sys.version.split()[0] != SNAPSHOT_PYTHON, reason=f"the snapshot is {SNAPSHOT_PYTHON}'s"
)
def test_snapshot_is_this_pythons_pydoc_topics():
    from attention_course.data.text import pydoc_topics_text

    assert pydoc_topics_text() == python_docs()


@pytest.mark.parametrize("python", OTHER_PYTHONS, ids=lambda p: p.parts[-3])
def test_another_python_reads_the_same_text_without_torch(python):
    if not python.exists():
        pytest.skip(f"{python} is not installed")
    result = subprocess.run(
        [str(python), "-c", READER, str(TEXT_PY)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    text = python_docs()
    assert got["python"] != SNAPSHOT_PYTHON
    assert got["sha256"] == SNAPSHOT_SHA256
    assert got["length"] == len(text) and got["vocab"] == "".join(sorted(set(text)))
    assert not got["torch imported"]
