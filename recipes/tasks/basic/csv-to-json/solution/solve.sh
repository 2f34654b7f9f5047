#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
python3 - <<'EOF'
import csv, json
with open("/app/people.csv", newline="") as f:
    rows = [{"name": r["name"], "age": int(r["age"]), "city": r["city"]} for r in csv.DictReader(f)]
with open("/app/people.json", "w") as f:
    json.dump(rows, f, indent=2)
EOF
