#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
grep -c apple /app/fruits.txt > /app/apple_count.txt
