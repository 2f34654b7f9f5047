#!/bin/bash
# Oracle: one command, absolute paths.
sort -u /app/list_41.txt > /app/ledger_53.txt
