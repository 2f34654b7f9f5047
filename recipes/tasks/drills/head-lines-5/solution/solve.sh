#!/bin/bash
# Oracle: one command, absolute paths.
head -n 5 /app/source_11.txt > /app/manifest_51.txt
