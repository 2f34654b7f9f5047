#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
printf 'hello\nworld\n' > /app/greeting.txt
