#!/bin/bash
# Oracle: one command, absolute paths.
grep TODO /app/items_24.txt > /app/input_44.txt
