#!/bin/bash
# Oracle: one command, absolute paths.
grep FAIL /app/ledger_72.txt > /app/batch_70.txt
