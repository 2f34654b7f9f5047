#!/bin/bash
# Oracle: one command, absolute paths.
echo 9054 > /app/roster_66.txt
