#!/usr/bin/env bash
# Build the textbook site strictly (zero warnings) into _build/html.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
VENV="${VENV:-.venv}"
rm -rf _build
# -q: no Sphinx status lines (each build printed two long parser-configuration dumps);
# warnings still show, and -W makes each one an error.
"$VENV/bin/jupyter-book" build . -q -W -n --keep-going
echo "The site is in _build/html/index.html"
