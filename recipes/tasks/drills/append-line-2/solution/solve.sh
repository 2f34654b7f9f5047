#!/bin/bash
# Oracle: one command, absolute paths.
echo yarrow >> /app/roster_12.txt
