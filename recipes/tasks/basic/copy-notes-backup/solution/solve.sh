#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
cp /app/notes.txt /app/notes.bak
