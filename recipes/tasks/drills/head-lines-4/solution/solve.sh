#!/bin/bash
# Oracle: one command, absolute paths.
head -n 5 /app/input_78.txt > /app/manifest_64.txt
