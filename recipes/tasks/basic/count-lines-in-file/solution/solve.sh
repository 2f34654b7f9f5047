#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
wc -l < /app/data.txt > /app/count.txt
