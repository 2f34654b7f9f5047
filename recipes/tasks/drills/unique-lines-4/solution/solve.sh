#!/bin/bash
# Oracle: one command, absolute paths.
sort -u /app/queue_51.txt > /app/ledger_36.txt
