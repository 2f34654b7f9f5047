#!/bin/bash
# Oracle: one command, absolute paths.
tr a-z A-Z < /app/source_27.txt > /app/roster_92.txt
