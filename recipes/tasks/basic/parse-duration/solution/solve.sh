#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
cat > /app/duration.py <<'EOF'
import re

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_PATTERN = re.compile(r"(?:(\d+)d)?\s*(?:(\d+)h)?\s*(?:(\d+)m)?\s*(?:(\d+)s)?")


def parse_duration(text):
    stripped = text.strip()
    match = _PATTERN.fullmatch(stripped)
    if not stripped or match is None or all(g is None for g in match.groups()):
        raise ValueError(f"invalid duration: {text!r}")
    return sum(int(g) * mult for g, mult in zip(match.groups(), _UNITS.values()) if g is not None)
EOF
