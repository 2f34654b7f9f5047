#!/bin/bash
# Oracle: one command, absolute paths.
wc -w < /app/source_90.txt > /app/sample_23.txt
