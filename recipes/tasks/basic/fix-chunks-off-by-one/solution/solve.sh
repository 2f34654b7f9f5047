#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
sed -i 's/range(0, len(items) - size, size)/range(0, len(items), size)/' /app/listutils.py
