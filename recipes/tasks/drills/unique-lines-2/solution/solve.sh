#!/bin/bash
# Oracle: one command, absolute paths.
sort -u /app/roster_47.txt > /app/catalog_80.txt
