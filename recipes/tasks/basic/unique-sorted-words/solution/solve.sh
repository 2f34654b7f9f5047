#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
sort -u /app/words.txt > /app/unique.txt
