#!/bin/bash
# Oracle: one command, absolute paths.
tr a-z A-Z < /app/sample_19.txt > /app/notes_a_92.txt
