#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
awk '{s += $1} END {print s}' /app/numbers.txt > /app/sum.txt
