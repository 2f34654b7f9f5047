#!/bin/bash
# Oracle: one command, absolute paths.
cp /app/input_25.txt /app/notes_a_87.txt
