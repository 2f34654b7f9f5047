#!/bin/bash
# Oracle: one command, absolute paths.
head -n 2 /app/input_68.txt > /app/roster_66.txt
