#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
sort /app/names.txt > /app/sorted.txt
