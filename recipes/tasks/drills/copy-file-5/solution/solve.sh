#!/bin/bash
# Oracle: one command, absolute paths.
cp /app/table_31.txt /app/sample_64.txt
