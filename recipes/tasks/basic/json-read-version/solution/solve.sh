#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
python3 -c 'import json; print(json.load(open("/app/package.json"))["version"])' > /app/version.txt
