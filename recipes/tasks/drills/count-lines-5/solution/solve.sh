#!/bin/bash
# Oracle: one command, absolute paths.
wc -l < /app/notes_a_25.txt > /app/roster_60.txt
