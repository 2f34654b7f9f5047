#!/bin/bash
# Oracle: one command, absolute paths.
wc -l < /app/roster_92.txt > /app/ledger_91.txt
