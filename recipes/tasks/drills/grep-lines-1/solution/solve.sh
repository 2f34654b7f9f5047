#!/bin/bash
# Oracle: one command, absolute paths.
grep WARN /app/table_46.txt > /app/notes_a_86.txt
