#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
cp /app/notes.txt /app/notes.bak
