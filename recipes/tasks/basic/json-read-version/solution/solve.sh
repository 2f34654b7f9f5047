#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
python3 -c 'import json; print(json.load(open("/app/package.json"))["version"])' > /app/version.txt
