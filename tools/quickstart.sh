#!/usr/bin/env bash
# The README's main job: set up (idempotent), then run the quickstart recipe on embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/stacx run recipes/quickstart.toml "$@"
