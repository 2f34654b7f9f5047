#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
cd /app/docs && find . -type f -name '*.txt' | sed 's|^\./||' | sort > /app/found.txt
