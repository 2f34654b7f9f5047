#!/bin/bash
# Oracle: one command, absolute paths.
sort /app/ledger_55.txt > /app/records_15.txt
