#!/bin/bash
# Oracle: one command, absolute paths.
echo 'print("maple alpha")' > /app/kettle.py
