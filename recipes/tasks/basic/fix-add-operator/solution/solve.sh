#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
cat > /app/mathops.py <<'EOF'
"""Small arithmetic helpers."""


def add(a, b):
    """Return a + b."""
    return a + b


def subtract(a, b):
    """Return a - b."""
    return a - b


def multiply(a, b):
    """Return a * b."""
    return a * b


def square(x):
    """Return x squared."""
    return multiply(x, x)
EOF
