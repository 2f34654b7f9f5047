#!/bin/bash
# Oracle: one command, absolute paths.
sort /app/list_11.txt > /app/report_56.txt
