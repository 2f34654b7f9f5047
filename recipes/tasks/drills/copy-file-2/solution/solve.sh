#!/bin/bash
# Oracle: one command, absolute paths.
cp /app/records_96.txt /app/source_29.txt
