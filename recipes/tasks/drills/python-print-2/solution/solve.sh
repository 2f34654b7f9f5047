#!/bin/bash
# Oracle: one command, absolute paths.
echo 'print("ember bravo")' > /app/quartz.py
