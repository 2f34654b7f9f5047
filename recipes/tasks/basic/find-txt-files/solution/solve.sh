#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
cd /app/docs && find . -type f -name '*.txt' | sed 's|^\./||' | sort > /app/found.txt
