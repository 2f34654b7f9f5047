#!/bin/bash
# Oracle: one command, absolute paths.
wc -l < /app/roster_53.txt > /app/sample_25.txt
