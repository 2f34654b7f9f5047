#!/bin/bash
# Oracle: one command, absolute paths.
sort -u /app/input_60.txt > /app/records_99.txt
