#!/bin/bash
# Oracle: one command, absolute paths.
tr a-z A-Z < /app/source_70.txt > /app/items_79.txt
