#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
sort -u /app/words.txt > /app/unique.txt
