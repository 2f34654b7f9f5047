#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
cat > /app/roman.py <<'EOF'
_TABLE = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
          (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
_CANONICAL = {}


def to_roman(n):
    if not isinstance(n, int) or not 1 <= n <= 3999:
        raise ValueError(f"out of range: {n!r}")
    out = []
    for value, sym in _TABLE:
        while n >= value:
            out.append(sym)
            n -= value
    return "".join(out)


def from_roman(s):
    if not _CANONICAL:
        _CANONICAL.update({to_roman(i): i for i in range(1, 4000)})
    if s not in _CANONICAL:
        raise ValueError(f"not a canonical roman numeral: {s!r}")
    return _CANONICAL[s]
EOF
