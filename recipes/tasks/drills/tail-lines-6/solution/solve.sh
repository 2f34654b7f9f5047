#!/bin/bash
# Oracle: one command, absolute paths.
tail -n 5 /app/entries_82.txt > /app/sample_41.txt
