#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
awk '{print $(NF-1)}' /app/access.log | sort -n | uniq -c | awk '{print $2, $1}' > /app/status_counts.txt
