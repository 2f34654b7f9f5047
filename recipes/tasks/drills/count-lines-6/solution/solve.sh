#!/bin/bash
# Oracle: one command, absolute paths.
wc -l < /app/input_53.txt > /app/sample_51.txt
