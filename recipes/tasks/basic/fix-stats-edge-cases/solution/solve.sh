#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
cat > /app/stats.py <<'EOF'
"""Descriptive statistics."""


def mean(values):
    """Arithmetic mean; 0.0 for an empty list."""
    if not values:
        return 0.0
    return sum(values) / len(values)


def median(values):
    """Median (average of the two middle values for an even count); 0.0 for an empty list."""
    if not values:
        return 0.0
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2 == 0:
        return (ordered[mid - 1] + ordered[mid]) / 2
    return float(ordered[mid])
EOF
