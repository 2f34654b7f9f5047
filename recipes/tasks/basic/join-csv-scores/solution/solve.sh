#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
python3 - <<'EOF'
import csv
users = list(csv.DictReader(open("/app/users.csv")))
totals = {u["id"]: 0 for u in users}
for row in csv.DictReader(open("/app/scores.csv")):
    totals[row["user_id"]] = totals.get(row["user_id"], 0) + int(row["score"])
rows = sorted(((u["name"], totals[u["id"]]) for u in users), key=lambda r: (-r[1], r[0]))
with open("/app/report.csv", "w") as f:
    f.write("name,total_score\n")
    for name, total in rows:
        f.write(f"{name},{total}\n")
EOF
