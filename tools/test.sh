#!/usr/bin/env bash
# The README's test command: set up (idempotent), lint, type-check, check the layers, run the
# whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
.venv/bin/ruff check stacx tests tools
.venv/bin/mypy stacx
.venv/bin/lint-imports  # the layer contracts in pyproject.toml
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
