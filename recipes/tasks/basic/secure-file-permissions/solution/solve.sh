#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
chmod 600 /app/secret.txt
