#!/bin/bash
# Oracle: one command, absolute paths.
tail -n 4 /app/items_11.txt > /app/report_93.txt
