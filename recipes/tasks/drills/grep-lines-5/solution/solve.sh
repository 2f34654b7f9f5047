#!/bin/bash
# Oracle: one command, absolute paths.
grep WARN /app/notes_a_66.txt > /app/notes_a_85.txt
