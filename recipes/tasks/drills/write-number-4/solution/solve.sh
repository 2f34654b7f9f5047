#!/bin/bash
# Oracle: one command, absolute paths.
echo 1022 > /app/input_21.txt
