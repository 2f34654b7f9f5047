#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
sed -i 's/foo/bar/g' /app/config.txt
