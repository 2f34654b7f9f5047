#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
sed -n '3,5p' /app/poem.txt > /app/excerpt.txt
