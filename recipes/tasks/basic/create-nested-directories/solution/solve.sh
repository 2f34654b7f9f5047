#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
mkdir -p /app/a/b/c
