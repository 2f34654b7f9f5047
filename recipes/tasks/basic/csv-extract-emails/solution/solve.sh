#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
tail -n +2 /app/users.csv | cut -d, -f2 > /app/emails.txt
