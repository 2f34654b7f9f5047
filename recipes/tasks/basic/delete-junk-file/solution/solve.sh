#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
rm /app/junk.txt
