#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
printf 'hello\nworld\n' > /app/greeting.txt
