#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
ls -S /app/files | head -n 1 > /app/largest.txt
