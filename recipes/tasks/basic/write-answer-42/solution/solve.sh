#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
echo 42 > /app/answer.txt
