#!/bin/bash
# Oracle: one command, absolute paths.
tr a-z A-Z < /app/list_54.txt > /app/records_20.txt
