#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
grep ERROR /app/app.log > /app/errors.txt
