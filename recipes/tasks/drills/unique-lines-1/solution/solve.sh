#!/bin/bash
# Oracle: one command, absolute paths.
sort -u /app/entries_10.txt > /app/catalog_57.txt
