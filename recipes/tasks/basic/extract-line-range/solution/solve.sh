#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
sed -n '3,5p' /app/poem.txt > /app/excerpt.txt
