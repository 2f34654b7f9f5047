#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
cd /app/images
for f in *.jpeg; do
  mv -- "$f" "${f%.jpeg}.jpg"
done
