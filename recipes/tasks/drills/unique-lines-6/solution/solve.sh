#!/bin/bash
# Oracle: one command, absolute paths.
sort -u /app/roster_39.txt > /app/inventory_45.txt
