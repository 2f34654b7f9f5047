#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
awk -F, 'NR == 1 || !seen[$1]++' /app/records.csv > /app/clean.csv
