#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
wc -l < /app/data.txt > /app/count.txt
