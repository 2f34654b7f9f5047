#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
cat > /app/search.py <<'EOF'
"""Binary search on ascending sorted lists."""


def binary_search(items, target):
    """Index of some occurrence of target in items, or -1."""
    lo, hi = 0, len(items) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if items[mid] == target:
            return mid
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1


def first_index(items, target):
    """Smallest index of target in items, or -1."""
    lo, hi = 0, len(items)
    while lo < hi:
        mid = (lo + hi) // 2
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid
    if lo < len(items) and items[lo] == target:
        return lo
    return -1
EOF
