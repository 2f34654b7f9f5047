#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
python3 - <<'EOF'
import heapq
deps = {}
for line in open("/app/deps.txt"):
    if ":" in line:
        target, rest = line.split(":", 1)
        deps[target.strip()] = rest.split()
nodes = set(deps) | {d for ds in deps.values() for d in ds}
remaining = {n: set(deps.get(n, [])) for n in nodes}
ready = [n for n, ds in remaining.items() if not ds]
heapq.heapify(ready)
order = []
while ready:
    n = heapq.heappop(ready)
    order.append(n)
    for m, ds in remaining.items():
        if n in ds:
            ds.remove(n)
            if not ds:
                heapq.heappush(ready, m)
open("/app/order.txt", "w").write("\n".join(order) + "\n")
EOF
