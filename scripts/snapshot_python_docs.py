"""Write the course's text, ``attention_course/assets/python_docs.txt.xz``, from pydoc_data.

Run from the repository root with Python 3.11.7 (the snapshot is that Python's
documentation topics; another Python has other text and is refused)::

    python scripts/snapshot_python_docs.py
    python scripts/snapshot_python_docs.py --out /tmp/docs.txt.xz --any-python

It joins ``pydoc_data.topics`` with :func:`attention_course.data.text.pydoc_topics_text`,
encodes it as UTF-8 and compresses it with xz (preset 9), then checks that the file
decompresses to text whose SHA-256 is ``SNAPSHOT_SHA256``. :func:`attention_course.data.
python_docs` reads the file, so every Python gets the same text.
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import platform
import sys
from pathlib import Path

from attention_course.data.text import (
    SNAPSHOT,
    SNAPSHOT_PYTHON,
    SNAPSHOT_SHA256,
    pydoc_topics_text,
)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=SNAPSHOT)
    parser.add_argument("--any-python", action="store_true", help="skip the version check")
    args = parser.parse_args(argv)
    if platform.python_version() != SNAPSHOT_PYTHON and not args.any_python:
        this = platform.python_version()
        sys.exit(f"the snapshot is Python {SNAPSHOT_PYTHON}'s text; this is {this}")
    data = pydoc_topics_text().encode("utf-8")
    args.out.write_bytes(lzma.compress(data, preset=9))
    digest = hashlib.sha256(lzma.decompress(args.out.read_bytes())).hexdigest()
    if digest != SNAPSHOT_SHA256 and not args.any_python:
        sys.exit(f"{args.out}: text SHA-256 {digest}, expected {SNAPSHOT_SHA256}")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, text {len(data)} bytes)")
    return args.out


if __name__ == "__main__":
    main()
