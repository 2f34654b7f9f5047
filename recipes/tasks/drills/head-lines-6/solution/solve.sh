#!/bin/bash
# Oracle: one command, absolute paths.
head -n 3 /app/roster_23.txt > /app/input_77.txt
