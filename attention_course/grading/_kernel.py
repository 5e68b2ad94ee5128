"""The grader's kernel: the current interpreter, under a memory limit, over IPC sockets.

``python -m attention_course.grading._kernel --memory-limit BYTES -- -f CONNECTION_FILE`` sets
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
        """Launches ``python -m attention_course.grading._kernel`` with a memory limit, over IPC."""

        memory_limit: int = DEFAULT_MEMORY_LIMIT
        scratch = None  # an isolation.Scratch: the kernel runs in a bwrap sandbox
        limits = None  # isolation.Limits for the sandbox
        package = None  # the package folder the sandbox shows (the exercise's build)

        def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
            cmd = super().format_kernel_cmd(extra_arguments)
            if cmd[1:3] != ["-m", "ipykernel_launcher"]:
                return cmd
            if self.scratch is None:
                return [
                    cmd[0],
                    "-m",
                    "attention_course.grading._kernel",
                    f"--memory-limit={int(self.memory_limit)}",
                    "--",
                    *cmd[3:],
                ]
            from . import isolation

            limits = self.limits or isolation.Limits(memory=self.memory_limit)
            kernel = [cmd[0], "-m", "attention_course.grading._kernel", *limits.kernel_arguments()]
            return isolation.command([*kernel, "--", *cmd[3:]], self.scratch, self.package)

        def kernel_pid(self) -> int | None:
            """The kernel's process id (in a sandbox: the kernel's, not bwrap's)."""
            process = getattr(self.provisioner, "process", None)
            if process is None or process.poll() is not None:
                return None
            if self.scratch is None:
                return process.pid
            from .isolation import sandbox_processes

            return sandbox_processes(process.pid)[0]

        def cpu_seconds(self) -> float | None:
            """CPU seconds the kernel and every process it started have used (in a
            sandbox: every process of the sandbox); None when it is not running."""
            process = getattr(self.provisioner, "process", None)
            if process is None or process.poll() is not None:
                return None
            from .isolation import cpu_seconds

            return cpu_seconds(process.pid)

        def leftover_processes(self) -> int:
            """How many processes of the sandbox, besides the kernel, are running."""
            process = getattr(self.provisioner, "process", None)
            if self.scratch is None or process is None or process.poll() is not None:
                return 0
            from .isolation import sandbox_processes

            return len(sandbox_processes(process.pid)[1])

        def interrupt_pid(self) -> None:
            """SIGINT to the kernel itself (bwrap does not pass signals on)."""
            pid = self.kernel_pid()
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGINT)
                except (ProcessLookupError, PermissionError):
                    pass

        async def interrupt_kernel(self) -> None:
            if self.scratch is None:
                return await super().interrupt_kernel()
            self.interrupt_pid()

        _async_interrupt_kernel = interrupt_kernel

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
            if self.scratch is not None and code > 128:  # bwrap: 128 + the kernel's signal
                code = 128 - code
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


def grader_kernel_manager(
    memory_limit: int = DEFAULT_MEMORY_LIMIT,
    scratch=None,
    limits=None,
    package=None,
    **options: Any,
):
    """A kernel manager for grading: this interpreter's ``python3`` kernel, ``memory_limit``
    bytes of memory, IPC transport. ``scratch`` (an `isolation.Scratch`): the kernel runs
    in a bwrap sandbox whose only writable folder that is, under ``limits``, and sees
    ``package`` (the exercise's build, `attention_course.grading.absent`) as the package."""
    import tempfile
    import uuid

    from jupyter_client.kernelspec import KernelSpecManager

    # IPC socket files go by an absolute path: the kernel runs in the notebook's folder.
    if scratch is not None:  # the sandbox sees its own run/ folder, nothing else
        folder = str(scratch.run)
        options.setdefault("connection_file", os.path.join(folder, "kernel.json"))
    else:
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
    km.scratch, km.limits, km.package = scratch, limits, package
    return km


def main(argv: list[str]) -> None:
    values = {"memory-limit": 0, "max-processes": 0, "cpu-limit": 0, "file-size-limit": 0}
    hard = False
    while argv and argv[0] != "--":
        arg = argv.pop(0)
        name, _, value = arg.removeprefix("--").partition("=")
        if name in values:
            values[name] = int(value)
        hard = hard or name == "hard-limits"
    if argv and argv[0] == "--":
        argv.pop(0)
    if hard or any(values[k] for k in ("max-processes", "cpu-limit", "file-size-limit")):
        from .isolation import set_limits

        set_limits(
            values["memory-limit"],
            values["max-processes"],
            values["cpu-limit"],
            values["file-size-limit"],
            hard,
        )
    else:
        set_memory_limit(values["memory-limit"])
    sys.argv = ["ipykernel_launcher", *argv]
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main(sys.argv[1:])
