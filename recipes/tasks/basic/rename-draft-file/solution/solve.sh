#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
mv /app/draft.txt /app/final.txt
