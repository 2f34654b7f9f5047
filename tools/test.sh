#!/usr/bin/env bash
# The README's test command: set up (idempotent), lint, type-check, check the layers, build the
# docs, run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
.venv/bin/ruff check stacx tests tools
.venv/bin/ruff format --check stacx tests tools
.venv/bin/mypy stacx
.venv/bin/lint-imports  # the layer contracts in pyproject.toml
# the docs site: a broken link or anchor fails the build (mkdocs.yml); built into a temp dir
docs_site="$(mktemp -d)"
.venv/bin/mkdocs build --strict --quiet -d "$docs_site"
rm -rf "$docs_site"
# one torch/OpenMP thread per process: three workers (and the runs they start) share two cores, and
# OpenMP's spinning threads slow each other several-fold when they outnumber the cores
export OMP_NUM_THREADS=1
# three workers on two cores: tests overlap their waits on Docker, subprocesses and sockets; one test
# file per worker at a time (module fixtures run once; tests/conftest.py orders the long files
# first; --no-loadscope-reorder keeps that order); the 25 slowest tests are listed at the end, to
# keep the suite within its time
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n 3 --dist loadfile --no-loadscope-reorder \
  --durations=25 "$@"
