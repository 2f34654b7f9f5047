#!/bin/bash
# Oracle: one command, absolute paths.
cp /app/sample_83.txt /app/report_47.txt
