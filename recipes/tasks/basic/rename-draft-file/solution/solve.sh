#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
mv /app/draft.txt /app/final.txt
