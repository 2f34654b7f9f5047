#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
touch /app/ready.flag
