#!/bin/bash
# Oracle: one command, absolute paths.
tail -n 1 /app/items_36.txt > /app/items_50.txt
