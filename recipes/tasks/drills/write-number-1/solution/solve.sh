#!/bin/bash
# Oracle: one command, absolute paths.
echo 1210 > /app/sample_70.txt
