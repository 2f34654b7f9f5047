#!/bin/bash
# Oracle: one command, absolute paths.
grep TODO /app/entries_62.txt > /app/inventory_45.txt
