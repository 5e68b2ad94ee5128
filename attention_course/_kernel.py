"""The grader's kernel: the current interpreter, under a memory limit, over IPC sockets.

``python -m attention_course._kernel --memory-limit BYTES -- -f CONNECTION_FILE`` sets
``RLIMIT_DATA`` (on Linux 4.7 and later: the private writable memory the process may
map, heap and anonymous ``mmap`` alike) on itself and then starts the usual
``ipykernel`` kernel. ``RLIMIT_DATA`` rather than ``RLIMIT_AS`` (all address space):
CUDA reserves tens of GiB of address space that it never writes (inaccessible
mappings, which ``RLIMIT_DATA`` does not count), so an address-space limit would stop
CUDA from starting on a GPU machine. A cell that allocates more than the limit gets a
``MemoryError`` (or PyTorch's "can't allocate memory" ``RuntimeError``) instead of
taking the machine's memory; a limit of 0 means no limit. The grader's kernel manager
(`GraderKernelManager`) launches kernels this way, talks to them over Unix-domain (IPC)
sockets rather than TCP (so ipykernel has no "running over TCP without encryption"
warning to print, and no port is opened), and, when a kernel is shut down, kills its
whole process group, so a process the submission forked does not outlive its grade.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

DEFAULT_MEMORY_LIMIT = 4 << 30  # bytes of private writable memory per kernel (4 GiB)


def set_memory_limit(limit: int) -> None:
    """Limit this process's private writable memory to ``limit`` bytes (0: no limit)."""
    if limit <= 0:
        return
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def parse_size(text: str) -> int:
    """``"4G"``, ``"512M"``, ``"4GiB"``, ``"0"`` or a number of bytes -> bytes."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(value[-1:], 1)
    number = value[:-1] if scale > 1 else value
    try:
        size = float(number) * scale
    except ValueError:
        raise ValueError(f"not a size: {text!r} (use e.g. 4G, 512M or 0 for no limit)") from None
    if size < 0:
        raise ValueError(f"not a size: {text!r}")
    return int(size)


def _kernel_manager_class():
    from jupyter_client.manager import AsyncKernelManager

    class GraderKernelManager(AsyncKernelManager):
        """Launches ``python -m attention_course._kernel`` with a memory limit, over IPC."""

        memory_limit: int = DEFAULT_MEMORY_LIMIT

        def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
            cmd = super().format_kernel_cmd(extra_arguments)
            if cmd[1:3] == ["-m", "ipykernel_launcher"]:
                cmd = [
                    cmd[0],
                    "-m",
                    "attention_course._kernel",
                    f"--memory-limit={int(self.memory_limit)}",
                    "--",
                    *cmd[3:],
                ]
            return cmd

        def kill_process_group(self) -> None:
            """SIGKILL the kernel's process group (the kernel and what it forked), and
            remove its socket files."""
            import glob

            for name in glob.glob(glob.escape(self.ip) + "-*"):
                try:
                    os.remove(name)
                except OSError:
                    pass
            pgid = getattr(self.provisioner, "pgid", None)
            if pgid and pgid != os.getpgid(0):
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

        def exit_description(self) -> str:
            """How the kernel process ended ("" if unknown or still running)."""
            process = getattr(self.provisioner, "process", None)
            code = process.poll() if process is not None else None
            if code is None:
                return ""
            if code < 0:
                try:
                    name = signal.Signals(-code).name
                except ValueError:
                    name = f"signal {-code}"
                what = {
                    "SIGSEGV": "a segmentation fault",
                    "SIGKILL": "killed, e.g. by the out-of-memory killer",
                    "SIGABRT": "aborted",
                    "SIGBUS": "a bus error",
                }.get(name, "")
                return f"{name}" + (f": {what}" if what else "")
            return f"exit status {code}"

    return GraderKernelManager


def grader_kernel_manager(memory_limit: int = DEFAULT_MEMORY_LIMIT, **options: Any):
    """A kernel manager for grading: this interpreter's ``python3`` kernel, ``memory_limit``
    bytes of memory, IPC transport."""
    import tempfile
    import uuid

    from jupyter_client.kernelspec import KernelSpecManager

    # IPC socket files go by an absolute path: the kernel runs in the notebook's folder.
    folder = os.path.join(tempfile.gettempdir(), "attention-course-kernels")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    km = _kernel_manager_class()(
        kernel_name="python3",
        kernel_spec_manager=KernelSpecManager(kernel_dirs=[]),
        transport="ipc",
        ip=os.path.join(folder, uuid.uuid4().hex[:12]),
        **options,
    )
    km.memory_limit = int(memory_limit)
    return km


def main(argv: list[str]) -> None:
    limit = 0
    while argv and argv[0] != "--":
        arg = argv.pop(0)
        if arg.startswith("--memory-limit="):
            limit = int(arg.split("=", 1)[1])
    if argv and argv[0] == "--":
        argv.pop(0)
    set_memory_limit(limit)
    sys.argv = ["ipykernel_launcher", *argv]
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main(sys.argv[1:])
