#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
awk '{s += $1} END {print s}' /app/numbers.txt > /app/sum.txt
