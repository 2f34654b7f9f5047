#!/bin/bash
# Oracle: one command, absolute paths.
tail -n 5 /app/ledger_29.txt > /app/items_42.txt
