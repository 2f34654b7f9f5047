#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
chmod 600 /app/secret.txt
