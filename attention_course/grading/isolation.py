"""Each submission's kernel in its own operating-system sandbox (bubblewrap).

The grader does not try to watch what a submission does: it runs each submission's
kernel inside ``bwrap`` (the Debian/Ubuntu package ``bubblewrap``, the sandbox that
Flatpak uses), where the submission cannot reach what it must not touch:

* no network (its own, empty network namespace), its own PID namespace (it sees and can
  signal only its own processes; ``os.getppid()`` is the sandbox's init), its own IPC
  and UTS namespaces, a new session (``setsid``), and ``--die-with-parent``: when the
  grader stops the kernel, or dies, every process the submission started dies with it;
* an unprivileged user inside (uid and gid 65534, "nobody"), with no capabilities;
* a read-only view of the system (``/usr``, a few files of ``/etc``, the Python installation, the
  virtual environment) and of the package (bound alone at ``/opt/attention-course``,
  never the repository around it; when grading, the exercise's build of it, in which
  only what the exercise hands out is real: `attention_course.grading.absent`), and
  nothing else: not the class folder, not the
  other submissions, not the repository's ``exercises/solutions/``, not the grader's
  outputs (CSV, JUnit, JSON), not the home folder;
* one private writable folder (:class:`Scratch`): a copy of the one notebook being
  graded (the kernel's working folder), ``/tmp``, and the kernel's sockets;
* limits that hold for every process of the sandbox (set as hard limits, which an
  unprivileged process cannot raise): private writable memory per process
  (``RLIMIT_DATA``), a process and thread count (``RLIMIT_NPROC``, counted per user
  namespace, so per sandbox), CPU seconds per process (``RLIMIT_CPU``) and the size of
  a file written (``RLIMIT_FSIZE``).

:func:`check` starts a sandbox and asks it, from inside, what it can see and do; the
grader refuses to grade for credit when the sandbox is missing or does not hold
(``attention-course grade --no-sandbox`` runs kernels unconfined, for an instructor's
own quick run, and says so on every line it prints).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

SANDBOX_UID = 65534  # "nobody"
PACKAGE_MOUNT = "/opt/attention-course"  # where the package is seen inside the sandbox
DEFAULT_PROCESSES = 256  # processes and threads per sandbox (torch and ipykernel use ~40)
DEFAULT_CPU_SECONDS = 1800  # CPU seconds per kernel process
DEFAULT_FILE_SIZE = 1 << 30  # bytes: the largest file a submission may write
# what the kernel needs of /etc (the dynamic loader's cache, user names, time zone), not
# the rest of it (/etc/shadow, host keys, credentials)
ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/alternatives",
    "/etc/fonts",
)
NO_SANDBOX_WARNING = "NOT SANDBOXED (--no-sandbox): not for credit |"
INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `apt-get install -y bubblewrap`; Fedora: "
    "`dnf install bubblewrap`), or grade your own notebooks with --no-sandbox"
)


class SandboxUnavailable(RuntimeError):
    """bwrap is missing, or a sandbox it made does not hold what the grader requires."""


@dataclass(frozen=True)
class Limits:
    """Resource limits for every process of one sandbox (0: none)."""

    memory: int = 4 << 30  # RLIMIT_DATA, bytes
    processes: int = DEFAULT_PROCESSES  # RLIMIT_NPROC
    cpu_seconds: int = DEFAULT_CPU_SECONDS  # RLIMIT_CPU
    file_size: int = DEFAULT_FILE_SIZE  # RLIMIT_FSIZE, bytes

    def kernel_arguments(self) -> list[str]:
        """The ``attention_course.grading._kernel`` options that set these limits."""
        return [
            f"--memory-limit={int(self.memory)}",
            f"--max-processes={int(self.processes)}",
            f"--cpu-limit={int(self.cpu_seconds)}",
            f"--file-size-limit={int(self.file_size)}",
            "--hard-limits",
        ]


def set_limits(memory: int, processes: int, cpu: int, file_size: int, hard: bool) -> None:
    """Set this process's resource limits (inherited by what it starts); 0 leaves one
    unchanged. ``hard``: the hard limit too, so that the process cannot raise it again."""
    import resource

    for what, value in (
        (resource.RLIMIT_DATA, memory),
        (resource.RLIMIT_NPROC, processes),
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_FSIZE, file_size),
    ):
        if value <= 0:
            continue
        soft, top = resource.getrlimit(what)
        if top != resource.RLIM_INFINITY:
            value = min(value, top)
        if what == resource.RLIMIT_CPU:
            # SIGXCPU at the soft limit (Python's default action: the process ends), the
            # kernel's SIGKILL a second later.
            resource.setrlimit(what, (value, value + 1 if hard else top))
        else:
            resource.setrlimit(what, (value, value if hard else top))


def bwrap() -> str | None:
    """The ``bwrap`` executable, or None."""
    return shutil.which("bwrap")


class Scratch:
    """One submission's private folder: ``work/`` (a copy of the notebook; the kernel's
    working folder), ``tmp/`` (the sandbox's ``/tmp``) and ``run/`` (the kernel's
    connection file and sockets, and the grader's probe sockets). Made by the grader
    (mode 0700), removed with everything in it by :meth:`remove`."""

    def __init__(self, notebook: Path | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ac-sandbox-")).resolve()
        os.chmod(self.root, 0o700)
        self.work = self.root / "work"
        self.tmp = self.root / "tmp"
        self.run = self.root / "run"
        for folder in (self.work, self.tmp, self.run):
            folder.mkdir(mode=0o700)
        if notebook is not None:
            shutil.copyfile(notebook, self.work / Path(notebook).name)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)  # never follows the sandbox's links


def _package_dir() -> Path:
    return Path(__file__).resolve().parent.parent  # attention_course/, not grading/


def _read_only_paths() -> list[tuple[str, str]]:
    """(source, destination) of every read-only bind: the system, Python, the venv."""
    wanted = {"/usr"}
    for prefix in (sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix):
        wanted.add(os.path.abspath(prefix))
        wanted.add(os.path.realpath(prefix))
    wanted.add(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    for entry in sys.path:  # site-packages outside the prefixes (a --user install)
        if entry.endswith(("site-packages", "dist-packages")) and os.path.isdir(entry):
            wanted.add(os.path.realpath(entry))
    package = str(_package_dir())
    binds = []
    for path in sorted(p for p in wanted if os.path.isdir(p)):
        if any(path.startswith(other.rstrip("/") + "/") for other in wanted if other != path):
            continue  # inside another bind already
        if package.startswith(path.rstrip("/") + "/") and "-packages" not in package:
            # a prefix that holds the source tree (the package installed editable from a
            # checkout under it) would show the repository: refuse rather than show it
            raise SandboxUnavailable(
                f"the Python environment {path} contains the course's source tree "
                f"({package}); the sandbox would show the repository"
            )
        binds.append((os.path.realpath(path), path))
    return binds


def command(kernel_cmd: list[str], scratch: Scratch, package: Path | None = None) -> list[str]:
    """``kernel_cmd`` wrapped in ``bwrap``: the sandbox of one submission.

    ``package``: the package folder to show at ``/opt/attention-course`` (default: the
    one the grader runs): the exercise's build (`attention_course.grading.absent.build`),
    in which the references the exercise does not hand out are absent. The build also
    covers the real package where a read-only bind would show it (installed into the
    environment's site-packages).
    """
    exe = bwrap()
    if exe is None:
        raise SandboxUnavailable("bwrap (bubblewrap) is not installed: " + INSTALL_HINT)
    args = [exe, "--die-with-parent", "--new-session", "--unshare-all", "--unshare-user"]
    args += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "grading"]
    args += ["--cap-drop", "ALL", "--clearenv"]
    # The sandbox's own /tmp first: a bind made later at a path under /tmp (a virtual
    # environment in /tmp, as CI's `mktemp -d` venv is) then shows through it; bound
    # after, the new /tmp would hide it and the kernel's Python would not be found.
    args += ["--bind", str(scratch.tmp), "/tmp"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for path in ETC_FILES:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    binds = _read_only_paths()
    for source, destination in binds:
        args += ["--ro-bind", source, destination]
    real = str(_package_dir())
    if package is not None and any(real.startswith(d.rstrip("/") + "/") for _, d in binds):
        # the package installed into a bound environment (site-packages): its build hides
        # it there too, so that the reference is absent by any path
        args += ["--ro-bind", str(package), real]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--bind", str(scratch.root), str(scratch.root)]
    args += ["--ro-bind", str(package or _package_dir()), f"{PACKAGE_MOUNT}/attention_course"]
    args += ["--chdir", str(scratch.work)]
    env = {
        "HOME": "/tmp",
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/bin", "/bin"]),
        "PYTHONPATH": PACKAGE_MOUNT,
        "LANG": "C.UTF-8",
        "JUPYTER_RUNTIME_DIR": "/tmp/jupyter-runtime",
        "MPLCONFIGDIR": "/tmp/matplotlib",
        "MPLBACKEND": "agg",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    }
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "ATTENTION_COURSE_DEVICE", "VIRTUAL_ENV"):
        if name in os.environ:
            env[name] = os.environ[name]
    for name, value in env.items():
        args += ["--setenv", name, value]
    return [*args, "--", *kernel_cmd]


# ---------------------------------------------------------------- the self-check

_PROBE = r"""
import json, os, socket, sys
out = {"uid": os.getuid(), "gid": os.getgid(), "pid": os.getpid(), "ppid": os.getppid()}
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2).close()
    out["network"] = True
except OSError:
    out["network"] = False
out["interfaces"] = sorted(name for _, name in socket.if_nameindex())
out["visible"] = [p for p in json.loads(sys.argv[1]) if os.path.exists(p)]
try:
    open("/usr/.ac-probe", "w")
    out["system_writable"] = True
except OSError:
    out["system_writable"] = False
open("probe.txt", "w").write("ok")
out["scratch_writable"] = True
out["processes"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
import resource
out["nproc"] = resource.getrlimit(resource.RLIMIT_NPROC)
import attention_course
out["package"] = os.path.dirname(attention_course.__file__)
print(json.dumps(out))
"""


def check(hidden: list[Path] = (), limits: Limits | None = None) -> dict:
    """Start a sandbox and ask it, from inside, what it sees and can do; raise
    :class:`SandboxUnavailable` with every problem found. ``hidden``: paths that must
    not be visible inside (the class folder, the outputs, the solved twins).

    Returns what the sandbox reported (uid, interfaces, limits, ...)."""
    limits = limits or Limits(memory=0)
    scratch = Scratch()
    try:
        paths = sorted({str(Path(p).resolve()) for p in hidden} | {_solutions_dir()})
        boot = (
            "import sys; from attention_course.grading.isolation import set_limits; "
            f"set_limits(0, {limits.processes}, {limits.cpu_seconds}, 0, True); "
            "source = sys.argv[1]; sys.argv = sys.argv[1:]; exec(source)"
        )
        kernel = [sys.executable, "-c", boot, _PROBE, json.dumps(paths)]
        try:
            done = subprocess.run(
                command(kernel, scratch), capture_output=True, text=True, timeout=120
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise SandboxUnavailable(f"bwrap could not start a sandbox: {error}") from None
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise SandboxUnavailable(f"bwrap could not start a sandbox: {why}")
        report = json.loads(done.stdout.strip().splitlines()[-1])
        problems = []
        if report["uid"] != SANDBOX_UID:
            problems.append(f"runs as uid {report['uid']}, not {SANDBOX_UID}")
        if report["network"] or report["interfaces"] not in ([], ["lo"]):
            problems.append(f"has a network ({report['interfaces']})")
        if report["system_writable"]:
            problems.append("can write to /usr")
        if report["visible"]:
            problems.append("can see " + ", ".join(report["visible"]))
        if len(report["processes"]) > 3 or report["ppid"] != 1:
            problems.append(f"sees processes outside it ({report['processes']})")
        if not (scratch.work / "probe.txt").exists():
            problems.append("its scratch folder is not the grader's")
        if report["package"] != f"{PACKAGE_MOUNT}/attention_course":
            problems.append(f"imports the package from {report['package']}")
        if problems:
            raise SandboxUnavailable("the sandbox does not hold: " + "; ".join(problems))
        return report
    finally:
        scratch.remove()


_CHECKED: dict = {}  # the self-check's outcome, once per process


def require(hidden: list[Path] = ()) -> None:
    """Make sure a sandbox holds before a grade: :func:`check` once per process (it
    starts one), and, for every path in ``hidden``, that no read-only bind shows it.
    Raises :class:`SandboxUnavailable`."""
    if "result" not in _CHECKED:
        try:
            _CHECKED["result"] = check()
        except SandboxUnavailable as error:
            _CHECKED["result"] = error
    if isinstance(_CHECKED["result"], SandboxUnavailable):
        raise _CHECKED["result"]
    shown = [destination for _, destination in _read_only_paths()] + ["/usr", *ETC_FILES]
    for path in hidden:
        path = os.path.realpath(path)
        for bind in shown:
            if path == bind or path.startswith(bind.rstrip("/") + "/"):
                raise SandboxUnavailable(f"the sandbox would show {path} (inside {bind})")


def _solutions_dir() -> str:
    """The repository's solved twins, when the package runs from a checkout."""
    return str(_package_dir().parent / "exercises" / "solutions")


# ---------------------------------------------------------------- processes


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (by /proc, in the grader's PID namespace)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stream:
                stat = stream.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 19 and int(fields[1]) == pid:
            found.append((int(fields[19]), int(name)))  # (start time, pid)
    return [p for _, p in sorted(found)]


def sandbox_processes(bwrap_pid: int) -> tuple[int | None, list[int]]:
    """(the kernel's pid, the other processes of the sandbox), as the grader sees them.

    bwrap starts the sandbox's init, whose first child is the kernel; a process the
    submission left behind (a double-forked daemon) is re-parented to that init."""
    inits = _children(bwrap_pid)
    if not inits:
        return None, []
    below = _children(inits[0])
    if not below:
        return None, []
    others: list[int] = []
    todo = list(below[1:]) + _children(below[0])
    while todo:
        pid = todo.pop()
        others.append(pid)
        todo += _children(pid)
    return below[0], others


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat", "rb") as stream:
        return stream.read().decode(errors="replace").rsplit(")", 1)[-1].split()


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user and system) of ``pid`` and every process below it, the ones that
    ended and were waited for included; None when ``pid`` is gone."""
    ticks = float(os.sysconf("SC_CLK_TCK"))
    try:
        fields = _stat(pid)
    except OSError:
        return None
    total = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    todo = _children(pid)
    while todo:
        child = todo.pop()
        try:
            total += sum(int(_stat(child)[i]) for i in (11, 12))
        except OSError:
            continue
        todo += _children(child)
    return total / ticks
