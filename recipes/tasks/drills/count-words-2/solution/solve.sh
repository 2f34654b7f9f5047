#!/bin/bash
# Oracle: one command, absolute paths.
wc -w < /app/table_74.txt > /app/inventory_77.txt
