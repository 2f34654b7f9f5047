#!/bin/bash
# Oracle: one command, absolute paths.
wc -w < /app/records_76.txt > /app/items_18.txt
