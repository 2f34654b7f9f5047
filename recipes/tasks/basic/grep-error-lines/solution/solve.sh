#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
grep ERROR /app/app.log > /app/errors.txt
