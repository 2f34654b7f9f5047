#!/bin/bash
# Oracle: one command, absolute paths.
tail -n 3 /app/roster_14.txt > /app/batch_97.txt
