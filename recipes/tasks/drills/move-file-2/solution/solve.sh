#!/bin/bash
# Oracle: one command, absolute paths.
mv /app/entries_43.txt /app/records_38.txt
