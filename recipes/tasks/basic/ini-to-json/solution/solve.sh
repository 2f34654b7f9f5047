#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
python3 - <<'EOF'
import configparser, json
cp = configparser.ConfigParser()
cp.read("/app/settings.ini")
data = {s: dict(cp[s]) for s in cp.sections()}
json.dump(data, open("/app/settings.json", "w"), indent=2)
EOF
