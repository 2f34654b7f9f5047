#!/bin/bash
# Oracle: one command, absolute paths.
echo quartz > /app/roster_61.txt
