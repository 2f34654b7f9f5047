#!/bin/bash
# Oracle: one command, absolute paths.
wc -l < /app/notes_a_25.txt > /app/notes_a_48.txt
