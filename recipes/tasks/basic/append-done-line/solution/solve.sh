#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
echo done >> /app/log.txt
