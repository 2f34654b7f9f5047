#!/bin/bash
# Oracle: one command, absolute paths.
echo orchid >> /app/notes_a_31.txt
