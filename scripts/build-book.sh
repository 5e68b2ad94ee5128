#!/usr/bin/env bash
# Build the textbook site strictly (zero warnings) into _build/html, and its Chinese
# edition (issue #32: the same notebooks, translated through locales/zh_CN) into
# _build/html/zh, also strictly. `--english` builds the English site only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
VENV="${VENV:-.venv}"
rm -rf _build
start=$(date +%s)
# -q: no Sphinx status lines (each build printed two long parser-configuration dumps);
# warnings still show, and -W makes each one an error.
"$VENV/bin/jupyter-book" build . -q -W -n --keep-going
echo "The site is in _build/html/index.html ($(( $(date +%s) - start )) s)"
if [ "${1:-}" != "--english" ]; then
    "$VENV/bin/python" scripts/zh.py build
fi
