#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
python3 - <<'EOF'
import csv
from decimal import Decimal
agg = {}
with open("/app/sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        key = (row["date"][:7], row["region"])
        total, count = agg.get(key, (Decimal(0), 0))
        agg[key] = (total + Decimal(row["amount"]), count + 1)
with open("/app/summary.csv", "w") as f:
    f.write("month,region,total,count\n")
    for (month, region), (total, count) in sorted(agg.items()):
        f.write(f"{month},{region},{total:.2f},{count}\n")
EOF
