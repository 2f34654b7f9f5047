#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
echo done >> /app/log.txt
