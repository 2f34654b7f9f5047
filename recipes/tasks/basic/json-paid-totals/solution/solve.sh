#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
python3 - <<'EOF'
import json
orders = json.load(open("/app/orders.json"))
totals = {}
for o in orders:
    if o["status"] == "paid":
        totals[o["customer"]] = totals.get(o["customer"], 0) + o["amount"]
json.dump({k: round(v, 2) for k, v in totals.items()}, open("/app/totals.json", "w"), indent=2)
EOF
