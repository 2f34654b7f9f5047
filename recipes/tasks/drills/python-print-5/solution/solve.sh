#!/bin/bash
# Oracle: one command, absolute paths.
echo 'print("raven pepper")' > /app/velvet.py
