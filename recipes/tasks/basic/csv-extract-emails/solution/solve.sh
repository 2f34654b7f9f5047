#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
tail -n +2 /app/users.csv | cut -d, -f2 > /app/emails.txt
