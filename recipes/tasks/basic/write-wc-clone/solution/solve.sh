#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
cat > /app/mywc.py <<'EOF'
import sys


def main(paths):
    status = 0
    total = [0, 0, 0]
    for path in paths:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            print(f"mywc: {path}: {exc.strerror}", file=sys.stderr)
            status = 1
            continue
        counts = [data.count(b"\n"), len(data.split()), len(data)]
        total = [t + c for t, c in zip(total, counts)]
        print(*counts, path)
    if len(paths) > 1:
        print(*total, "total")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
EOF
