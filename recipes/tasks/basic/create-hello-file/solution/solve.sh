#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
echo hello > /app/hello.txt
