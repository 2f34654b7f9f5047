#!/bin/bash
# Which Debian suite stands closer to an Ubuntu image (docs/tasks.md, "Base images, offline"): for the packages
# task Dockerfiles commonly `apt-get install`, those that bookworm / trixie cannot install by
# name (a virtual name with one provider counts as installable), and the toolchain versions each
# has. Ubuntu's archive is not reachable here: compare with noble's package set by hand. Reads the Debian mirror the host's apt uses, into
# private apt lists under $TMPDIR (the host's apt state is not touched). Needs apt; no root.
set -euo pipefail
mirror=${STACX_DEBIAN_MIRROR:-http://deb.debian.org/debian}
pkgs="curl wget git build-essential gcc g++ make cmake python3 python3-pip python3-venv python3-dev
python-is-python3 vim nano jq sqlite3 tmux unzip zip libssl-dev pkg-config nodejs npm golang-go
default-jdk openjdk-17-jdk openjdk-21-jdk r-base redis-server postgresql nginx procps net-tools
iputils-ping libffi-dev zlib1g-dev libsqlite3-dev libgl1 libglib2.0-0 ffmpeg imagemagick gnupg
ca-certificates software-properties-common lsb-release locales tzdata file less openssh-client
rsync bc gdb valgrind clang rustc cargo ruby php perl libpq-dev libxml2-dev libcurl4-openssl-dev
libgl1-mesa-glx libasound2 netcat netcat-openbsd p7zip-full xvfb poppler-utils tesseract-ocr
pandoc sudo cron supervisor python3.12 python3.12-venv libncurses5-dev libtinfo5
libpython3.12-dev lua5.4 maven sqlite3 time htop"
versions="python3 gcc cmake golang-go default-jdk git rustc ruby php perl clang postgresql
redis-server libc6 openssl"
for suite in bookworm trixie; do
  d=$(mktemp -d)
  mkdir -p "$d/lists/partial" "$d/cache/archives/partial"
  printf 'deb %s %s main\ndeb %s %s-updates main\n' "$mirror" "$suite" "$mirror" "$suite" \
    > "$d/sources.list"
  # an empty dpkg status: what the host has installed must not count as installable
  : > "$d/status"
  opts=(-o "Dir::Etc::sourcelist=$d/sources.list" -o Dir::Etc::sourceparts=/nonexistent
        -o "Dir::State::Lists=$d/lists" -o "Dir::Cache=$d/cache" -o "Dir::State::status=$d/status"
        -o APT::Architecture=amd64)
  apt-get "${opts[@]}" update > "$d/update.log" 2>&1
  missing=() n=0
  for p in $pkgs; do
    n=$((n + 1))
    c=$(apt-cache "${opts[@]}" policy "$p" 2>/dev/null | awk '/Candidate:/{print $2}')
    # a virtual name with one provider installs too (apt picks it: libglib2.0-0 -> ...t64)
    providers=$(apt-cache "${opts[@]}" showpkg "$p" 2>/dev/null \
      | sed -n '/^Reverse Provides:/,$p' | tail -n +2 | awk '{print $1}' | sort -u | wc -l)
    if { [ -z "$c" ] || [ "$c" = "(none)" ]; } && [ "$providers" -ne 1 ]; then
      missing+=("$p")
    fi
  done
  echo "$suite: $n packages, not installable by name: ${missing[*]:-none}"
  for p in $versions; do
    printf '%s=%s ' "$p" "$(apt-cache "${opts[@]}" policy "$p" 2>/dev/null | awk '/Candidate:/{print $2}')"
  done
  echo
  rm -rf "$d"
done
