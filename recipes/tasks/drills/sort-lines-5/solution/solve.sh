#!/bin/bash
# Oracle: one command, absolute paths.
sort /app/roster_51.txt > /app/batch_20.txt
