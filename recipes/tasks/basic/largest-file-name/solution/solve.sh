#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
ls -S /app/files | head -n 1 > /app/largest.txt
