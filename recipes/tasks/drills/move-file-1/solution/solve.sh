#!/bin/bash
# Oracle: one command, absolute paths.
mv /app/notes_a_33.txt /app/entries_71.txt
