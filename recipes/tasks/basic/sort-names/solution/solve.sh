#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
sort /app/names.txt > /app/sorted.txt
