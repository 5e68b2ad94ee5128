"""The ``attention-course`` command line.

``attention-course doctor`` prints versions, the device found and whether the
book's sources are in place (``--build`` builds the book strictly to check).
Subcommands are registered in :func:`build_parser`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .grading.notebooks import toc_files


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _find_root() -> Path | None:
    """The repository root: the nearest folder above the cwd with _config.yml and _toc.yml."""
    for folder in (Path.cwd(), *Path.cwd().parents):
        if (folder / "_config.yml").is_file() and (folder / "_toc.yml").is_file():
            return folder
    return None


def doctor(args: argparse.Namespace) -> int:
    """Print what a reader needs to know when something does not run."""
    import torch

    from .device import get_device

    ok = True
    print(f"python        {platform.python_version()} ({sys.executable})")
    for dist in ("attention-course", "torch", "numpy", "matplotlib", "tqdm"):
        print(f"{dist:<13} {_version(dist)}")
    for dist in ("jupyter-book", "nbval", "pytest", "nbclient", "jupyterlab"):
        print(f"{dist:<13} {_version(dist)}  (dev extra)")
    # The README's `jupyter lab book/` needs the `jupyter-lab` command beside this Python.
    lab = Path(sys.executable).parent / "jupyter-lab"
    if lab.exists() or shutil.which("jupyter-lab"):
        print("jupyter lab   found (jupyter lab book/ opens the chapters)")
    else:
        ok = False
        print(
            "jupyter lab   MISSING: `jupyter lab book/` will fail; "
            "pip install -e '.[dev]' (or bash scripts/setup-venv.sh)"
        )
    try:
        device = get_device()
        print(f"device        {device}")
        if device.type == "cuda":
            print(f"gpu           {torch.cuda.get_device_name(device)}")
    except ValueError as err:
        ok = False
        print(f"device        ERROR: {err}")
    bwrap = shutil.which("bwrap")
    print(
        f"bwrap         {bwrap or 'not installed: grading needs it (apt-get install bubblewrap)'}"
    )
    root = _find_root()
    if root is None:
        print("book          no _config.yml/_toc.yml found above the current folder")
        return 0 if ok else 1
    try:
        toc = toc_files(root)
    except ImportError:  # PyYAML comes with the dev extra's Jupyter Book
        print("book          cannot read _toc.yml: pip install 'attention-course[dev]'")
        return 0 if ok else 1
    missing = [f for f in toc if not any(root.glob(f + ".*")) and not (root / f).exists()]
    if missing:
        ok = False
        print(f"book          MISSING chapters listed in _toc.yml: {', '.join(missing)}")
    else:
        print(f"book          sources in place ({len(toc)} pages in _toc.yml)")
    if args.build:
        exe = shutil.which("jupyter-book")
        if exe is None:
            print("book build    jupyter-book is not installed (pip install -e '.[dev]')")
            return 1
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [exe, "build", str(root), "--path-output", tmp, "-W", "-n", "--keep-going"]
            result = subprocess.run(cmd, capture_output=True, text=True)
        built = result.returncode == 0
        ok = ok and built
        print(f"book build    {'OK (strict, zero warnings)' if built else 'FAILED'}")
        if not built:
            print(result.stdout[-3000:] + result.stderr[-3000:])
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attention-course", description="Tools for the attention course textbook."
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {_version('attention-course')}"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("doctor", help="print versions, the device found and the book's state")
    p.add_argument("--build", action="store_true", help="also build the book strictly")
    p.set_defaults(func=doctor)

    from .grading import grade as grading
    from .grading import release

    p = sub.add_parser(
        "release",
        help="for course authors: make the student exercise notebooks and the released "
        "task lists from exercises/solutions/ (needs the repository)",
    )
    release.add_arguments(p)
    p.set_defaults(func=release.run)
    p = sub.add_parser("grade", help="execute and grade a submitted exercise notebook")
    grading.add_arguments(p)
    p.set_defaults(func=grading.run)
    p = sub.add_parser(
        "gradebook",
        help="merge the results of `grade --out` runs into one CSV, JUnit and summary",
    )
    grading.add_gradebook_arguments(p)
    p.set_defaults(func=grading.run_gradebook)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
