#!/bin/bash
# Oracle: one command, absolute paths.
sort /app/report_21.txt > /app/manifest_99.txt
