#!/bin/bash
# Oracle: one command, absolute paths.
rm /app/source_49.txt
