#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
mkdir -p /app/out
