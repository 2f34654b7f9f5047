#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
cat > /app/textcheck.py <<'EOF'
"""Text checks."""


def is_palindrome(text):
    """True if text reads the same both ways, ignoring case and non-alphanumerics."""
    cleaned = [c.lower() for c in text if c.isalnum()]
    return cleaned == cleaned[::-1]
EOF
