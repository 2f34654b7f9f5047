#!/bin/bash
# Oracle: one command, absolute paths.
wc -w < /app/roster_87.txt > /app/records_96.txt
