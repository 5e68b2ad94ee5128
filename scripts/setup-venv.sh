#!/usr/bin/env bash
# Create (or reuse) a virtual environment with the package and its dev tools.
#   VENV=path   where the environment lives (default: .venv in the repository)
#   PYTHON=...  the interpreter that creates it (default: python3)
#   TORCH_SPEC  how torch is installed when the venv has none (default: torch==2.13.0;
#               installed FIRST, so that the project's permissive torch>=2.2 range
#               never pulls a different build)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    "$VENV/bin/python" -m pip install --quiet "${TORCH_SPEC:-torch==2.13.0}"
fi
# Re-install the project only when its metadata changed (the install is editable,
# so code changes need no re-install).
stamp="$VENV/.attention-course-stamp"
want="$(cat pyproject.toml scripts/setup-venv.sh | sha256sum | cut -d' ' -f1) $(pwd)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    # setuptools prints a boxed note on every editable install ("Please be careful with
    # folders ... same name as your package") that --quiet does not silence; it is advice
    # for a different layout than ours, so it is filtered here, and only it.
    PYTHONWARNINGS="ignore:Editable installation" "$VENV/bin/python" -m pip install --quiet -e ".[dev]"
    "$VENV/bin/python" -m ipykernel install --sys-prefix --name python3 --display-name "Python 3" >/dev/null
    # `jupyter nbconvert --execute` talks to its kernel over local (IPC) sockets instead of
    # TCP: the same as the grader, and without the kernel's "running over TCP without
    # encryption" warning on every run. Read from the venv's own config folder only. The
    # sockets' path must be absolute: the kernel runs in the notebook's folder and the
    # client where it was started, so a relative one (the default) hung every notebook
    # executed from another folder.
    mkdir -p "$VENV/etc/jupyter"
    rm -f "$VENV/etc/jupyter/jupyter_nbconvert_config.json"
    cat >"$VENV/etc/jupyter/jupyter_nbconvert_config.py" <<'PY'
# Written by scripts/setup-venv.sh: nbconvert's kernels talk over IPC sockets whose path is
# absolute (in Jupyter's runtime folder), whatever folder the kernel and the client run in.
import os

from jupyter_core.paths import jupyter_runtime_dir

_runtime = jupyter_runtime_dir()
os.makedirs(_runtime, exist_ok=True)
c.KernelManager.transport = "ipc"  # noqa: F821 - `c` is the config Jupyter passes
c.KernelManager.ip = os.path.join(_runtime, f"nbconvert-{os.getpid()}")  # noqa: F821
PY
    echo "$want" > "$stamp"
fi
