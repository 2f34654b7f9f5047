#!/bin/bash
# Oracle: one command, absolute paths.
mv /app/entries_86.txt /app/ledger_95.txt
