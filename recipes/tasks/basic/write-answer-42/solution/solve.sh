#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
echo 42 > /app/answer.txt
