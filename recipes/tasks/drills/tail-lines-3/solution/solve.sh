#!/bin/bash
# Oracle: one command, absolute paths.
tail -n 4 /app/entries_62.txt > /app/inventory_31.txt
