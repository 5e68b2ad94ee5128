"""Kernels and notebooks for the release and grading commands, through public APIs only.

Every notebook the course executes runs in a ``python3`` kernel that is *this very
interpreter*, so it imports the same ``attention_course`` and torch as the command that
starts it, whatever ``python3`` kernelspec happens to be installed on the machine
(``pytest --nbval-current-env`` does the same for the tests). jupyter_client already
knows that kernel: with no kernelspec folders to search, a ``KernelSpecManager`` falls back
to ipykernel's own spec, which launches ``sys.executable -m ipykernel_launcher``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # nbclient and jupyter_client come with the `dev` extra; imported when used
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient
    from nbformat import NotebookNode

KERNEL_NAME = "python3"
KERNEL_SPEC = {"name": KERNEL_NAME, "display_name": "Python 3", "language": "python"}


def kernel_manager(kernel_name: str = KERNEL_NAME) -> AsyncKernelManager:
    """A kernel manager whose ``python3`` kernel runs the current interpreter.

    Any other ``kernel_name`` is looked up among the installed kernelspecs as usual.
    """
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    specs = KernelSpecManager(kernel_dirs=[]) if kernel_name == KERNEL_NAME else None
    # Local (IPC) sockets, as the grader's kernels use: no TCP port, and no "running over
    # TCP without encryption" warning on every run. `ip` is the sockets' path prefix (the
    # kernel adds "-<n>" and removes them at shutdown).
    sockets = Path(tempfile.gettempdir()) / f"attention-course-kernel-{uuid.uuid4().hex}"
    return AsyncKernelManager(
        kernel_name=kernel_name, kernel_spec_manager=specs, transport="ipc", ip=str(sockets)
    )


def notebook_client(
    nb: NotebookNode, cwd: Path, timeout: float, kernel_name: str = KERNEL_NAME, **options: Any
) -> NotebookClient:
    """An nbclient client for ``nb`` with working directory ``cwd`` and a per-cell ``timeout``.

    The client is handed its kernel manager, so nbclient keeps the kernel alive after a
    run unless told otherwise: execute with ``cleanup_kc=True`` (``client.execute(...)`` or
    ``client.setup_kernel(...)``) to shut it down at the end.
    """
    from nbclient import NotebookClient

    return NotebookClient(
        nb,
        km=kernel_manager(kernel_name),
        kernel_name=kernel_name,
        timeout=int(max(1, round(timeout))),
        resources={"metadata": {"path": str(cwd)}},
        record_timing=False,
        **options,
    )


def missing_tools(command: str, stream: TextIO = sys.stdout) -> bool:
    """Print how to install nbformat/nbclient and return True when either is missing."""
    try:
        import nbclient  # noqa: F401
        import nbformat  # noqa: F401
    except ImportError as err:
        print(
            f"{command}: {err.name} is missing: pip install 'attention-course[grader]'", file=stream
        )
        return True
    return False


def toc_files(root: Path) -> list[str]:
    """Every ``root:`` and ``file:`` entry of the Jupyter Book table of contents, in order."""
    import yaml

    files: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key in ("root", "file"):
                if isinstance(node.get(key), str):
                    files.append(node[key])
            for value in node.values():
                if isinstance(value, (dict, list)):
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8")))
    return files


def add_timeout_argument(parser: argparse.ArgumentParser, default: float, what: str) -> None:
    """The commands' ``--timeout SECONDS`` option: the time limit ``what`` (e.g. "per cell")."""
    parser.add_argument(
        "--timeout",
        type=float,
        default=default,
        metavar="SECONDS",
        help=f"time limit {what} (default {default:g})",
    )


def command_main(
    prog: str,
    description: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int],
    argv: Sequence[str] | None = None,
) -> int:
    """``python -m attention_course.<command>``: parse ``argv`` and carry out the command."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_arguments(parser)
    return run(parser.parse_args(argv))
