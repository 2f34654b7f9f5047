#!/bin/bash
# Oracle: one command, absolute paths.
chmod +x /app/copper.sh
