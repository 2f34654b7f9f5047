#!/bin/bash
# Oracle: one command, absolute paths.
cp /app/manifest_40.txt /app/notes_a_96.txt
