#!/bin/bash
# Oracle: one command, absolute paths.
sort /app/entries_63.txt > /app/records_22.txt
