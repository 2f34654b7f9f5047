#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
sed -i 's/foo/bar/g' /app/config.txt
