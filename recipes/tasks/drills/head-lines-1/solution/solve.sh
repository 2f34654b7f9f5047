#!/bin/bash
# Oracle: one command, absolute paths.
head -n 3 /app/records_50.txt > /app/sample_78.txt
