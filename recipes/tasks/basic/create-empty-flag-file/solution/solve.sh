#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
touch /app/ready.flag
