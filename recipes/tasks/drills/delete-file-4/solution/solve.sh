#!/bin/bash
# Oracle: one command, absolute paths.
rm /app/input_86.txt
