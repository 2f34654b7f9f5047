#!/bin/bash
# Oracle: one command, absolute paths.
mv /app/list_99.txt /app/notes_a_17.txt
