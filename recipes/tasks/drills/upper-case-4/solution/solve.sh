#!/bin/bash
# Oracle: one command, absolute paths.
tr a-z A-Z < /app/batch_76.txt > /app/ledger_29.txt
