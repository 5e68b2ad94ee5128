#!/usr/bin/env bash
# Run every test: the package's unit tests and every notebook under book/ and
# exercises/, re-executed and compared with its committed outputs (nbval).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/test_attention.py`.
# `bash scripts/test.sh tests -m "not slow"`: the unit tests without those that start a
# Jupyter kernel or a bwrap sandbox (marker `slow`, pyproject.toml); CI runs everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
VENV="${VENV:-.venv}"
# One BLAS thread per worker: with two workers on two cores this is about twice as fast.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
"$VENV/bin/python" -m pytest --nbval -n "${PYTEST_WORKERS:-2}" --dist loadfile "$@"
