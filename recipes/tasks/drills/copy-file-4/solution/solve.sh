#!/bin/bash
# Oracle: one command, absolute paths.
cp /app/records_51.txt /app/entries_72.txt
