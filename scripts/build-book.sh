#!/usr/bin/env bash
# Build the textbook site strictly (zero warnings) into _build/html.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
VENV="${VENV:-.venv}"
rm -rf _build
"$VENV/bin/jupyter-book" build . -W -n --keep-going
echo "The site is in _build/html/index.html"
