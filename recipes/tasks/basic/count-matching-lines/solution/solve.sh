#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
grep -c apple /app/fruits.txt > /app/apple_count.txt
