#!/bin/bash
# Oracle: one command, absolute paths.
head -n 2 /app/batch_55.txt > /app/sample_65.txt
