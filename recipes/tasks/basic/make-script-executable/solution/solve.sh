#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
chmod +x /app/run.sh
