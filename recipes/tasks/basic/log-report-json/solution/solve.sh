#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
python3 - <<'EOF'
import json, statistics
rows = []
for line in open("/app/requests.log"):
    if line.strip():
        ts, *pairs = line.split()
        rows.append(dict(p.split("=", 1) for p in pairs))
by_user = {}
for r in rows:
    by_user[r["user"]] = by_user.get(r["user"], 0) + 1
report = {
    "total": len(rows),
    "errors": sum(int(r["status"]) >= 500 for r in rows),
    "by_user": by_user,
    "slowest_path": max(rows, key=lambda r: int(r["ms"]))["path"],
    "median_ms": statistics.median(int(r["ms"]) for r in rows),
}
json.dump(report, open("/app/report.json", "w"), indent=2)
EOF
