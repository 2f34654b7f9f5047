#!/bin/bash
# Oracle: one command, absolute paths.
echo 20 > /app/roster_52.txt
